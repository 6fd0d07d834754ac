"""The shared accountant (workers/privacy): events, exact pure sums, PLD for Gaussians.

Expected numbers come from outside the code under test: exact fractions for the pure
sums, dp-accounting's closed-form Gaussian ε (Balle & Wang 2018) and the ε values the
Aug-PE notebook prints for its published noise multipliers (aug-pe.md §3).
"""

from __future__ import annotations

import doctest
import json
import math
import time
from decimal import Decimal
from fractions import Fraction

import dp_accounting
import pytest
from dp_accounting import rdp
from scipy.optimize import brentq
from scipy.stats import norm

from workers.errors import ConfigError
from workers.privacy import accountant, calibration
from workers.privacy import events as events_module
from workers.privacy.accountant import (
    EXACT_SUM,
    PLD_NAME,
    compose,
    compose_datasets,
    compose_jobs,
)
from workers.privacy.calibration import (
    GaussianRelease,
    PlannedMechanism,
    analytic_gaussian_sigma,
    calibrate_noise_multiplier,
    gaussian_noise_multiplier,
    split_budget,
)
from workers.privacy.events import PrivacyEvent, exact_decimal, plan_composition


def laplace(
    epsilon: str | float,
    *,
    partition: str | None = None,
    count: int = 1,
    mechanism: str = "vocabulary-histogram",
    delta: str | None = None,
) -> PrivacyEvent:
    eps = float(epsilon)
    return PrivacyEvent(
        mechanism=mechanism,
        noise="laplace",
        scale=1 / eps,
        sensitivity=1.0,
        norm="l1",
        dimension=10,
        partition=partition,
        count=count,
        epsilon=exact_decimal(epsilon),
        delta=None if delta is None else Decimal(delta),
    )


def gaussian(
    sigma: float,
    *,
    sensitivity: float = 1.0,
    count: int = 1,
    partition: str | None = None,
    mechanism: str = "pe-histogram",
    delta: str | None = None,
) -> PrivacyEvent:
    return PrivacyEvent(
        mechanism=mechanism,
        noise="gaussian",
        scale=sigma,
        sensitivity=sensitivity,
        norm="l2",
        dimension=100,
        partition=partition,
        count=count,
        delta=None if delta is None else Decimal(delta),
    )


def aug_pe_delta(n: int) -> float:
    return 1 / (n * math.log(n))


# ---------------------------------------------------------------- events


def test_event_round_trips_through_json_exactly() -> None:
    event = PrivacyEvent(
        mechanism="kde",
        name="kde[a,B=1]",
        noise="laplace",
        scale=3.0,
        sensitivity=1.5,
        norm="l1",
        dimension=64,
        partition="a",
        count=2,
        epsilon=Decimal("0.5000000000000001"),
    )
    data = json.loads(json.dumps(event.to_dict()))
    assert data["epsilon"] == "0.5000000000000001"
    assert PrivacyEvent.from_dict(data) == event


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"noise": "cauchy"}, "noise"),
        ({"norm": "l2"}, "norm"),  # Laplace is calibrated to L1
        ({"epsilon": Decimal("0.4")}, "epsilon"),  # below Δ/b = 0.5
        ({"epsilon": None}, "epsilon"),
        ({"scale": 0.0}, "scale"),
        ({"scale": math.inf}, "scale"),
        ({"sensitivity": -1.0}, "sensitivity"),
        ({"dimension": 0}, "dimension"),
        ({"count": True}, "count"),
        ({"partition": ""}, "partition"),
        ({"mechanism": " "}, "mechanism"),
        ({"delta": 0}, "delta"),  # no δ is None, not 0
        ({"delta": Decimal(1)}, "delta"),
        ({"delta": "-1e-7"}, "delta"),
        ({"delta": "a lot"}, "delta"),
        ({"delta": math.nan}, "delta"),
        ({"delta": True}, "delta"),
    ],
)
def test_bad_events_are_refused_naming_the_field(change: dict[str, object], field: str) -> None:
    fields: dict[str, object] = dict(
        mechanism="m",
        noise="laplace",
        scale=2.0,
        sensitivity=1.0,
        norm="l1",
        dimension=3,
        epsilon=Decimal("0.5"),
    )
    fields.update(change)
    with pytest.raises(ConfigError) as err:
        PrivacyEvent(**fields)  # type: ignore[arg-type]
    assert err.value.field == field


def test_gaussian_events_have_no_epsilon_of_their_own() -> None:
    with pytest.raises(ConfigError) as err:
        PrivacyEvent(
            mechanism="m",
            noise="gaussian",
            scale=2.0,
            sensitivity=1.0,
            norm="l2",
            dimension=3,
            epsilon=Decimal(1),
        )
    assert err.value.field == "epsilon"


def test_discrete_gaussian_sensitivity_shape() -> None:
    with pytest.raises(ConfigError, match="integer sensitivity"):
        PrivacyEvent(
            mechanism="m",
            noise="discrete_gaussian",
            scale=2.0,
            sensitivity=1.5,
            norm="l2",
            dimension=1,
        )
    with pytest.raises(ConfigError, match="sensitivity²"):
        PrivacyEvent(
            mechanism="m",
            noise="discrete_gaussian",
            scale=2.0,
            sensitivity=1.5,
            norm="l2",
            dimension=5,
        )
    PrivacyEvent(
        mechanism="m",
        noise="discrete_gaussian",
        scale=2.0,
        sensitivity=math.sqrt(3),
        norm="l2",
        dimension=5,
    )


def test_delta_spent_outright_round_trips_and_old_events_read_back() -> None:
    event = PrivacyEvent(
        mechanism="dp-eda-limited-domain",
        name="limited-domain[t=1]",
        noise="gumbel_top_k",
        scale=8.0,
        sensitivity=2.0,
        norm="linf",
        dimension=301,
        partition="a",
        count=3,
        epsilon=Decimal("0.25"),
        delta=7.5e-08,  # type: ignore[arg-type]  # a float reads as the decimal it prints
    )
    data = json.loads(json.dumps(event.to_dict()))
    assert data["delta"] == "7.5E-8"
    assert PrivacyEvent.from_dict(data) == event
    assert event.total_delta == Decimal("2.25e-7")
    assert not event.is_pure
    # an event without δ is written as before, and a stored row without the key reads back
    old = laplace("0.5").to_dict()
    assert "delta" not in old
    restored = PrivacyEvent.from_dict(old)
    assert restored.delta is None and restored.total_delta == 0 and restored.is_pure
    assert PrivacyEvent.from_dict({**old, "delta": None}) == restored


def test_from_dict_refuses_unknown_and_missing_fields() -> None:
    data = laplace("1").to_dict()
    with pytest.raises(ConfigError, match="unknown field"):
        PrivacyEvent.from_dict({**data, "epsilonn": "1"})
    del data["norm"]
    with pytest.raises(ConfigError, match="missing field"):
        PrivacyEvent.from_dict(data)


def test_plan_makes_parallel_groups_explicit() -> None:
    plan = plan_composition(
        [
            laplace("1"),
            laplace("0.5", partition="b", mechanism="kde"),
            laplace("0.5", partition="a", mechanism="kde"),
            laplace("0.25", partition="a", mechanism="kde"),
            laplace("0.5", partition="a", mechanism="counts"),
        ]
    )
    assert [e.epsilon for e in plan.sequential] == [Decimal(1)]
    assert [g.mechanism for g in plan.parallel] == ["counts", "kde"]
    kde = plan.parallel[1]
    assert [(p, [e.epsilon for e in ev]) for p, ev in kde.partitions] == [
        ("a", [Decimal("0.5"), Decimal("0.25")]),
        ("b", [Decimal("0.5")]),
    ]
    # whole-dataset 1 + counts' worst class 0.5 + kde's worst class 0.75
    assert compose(plan.events).epsilon() == Decimal("2.25")


# ---------------------------------------------------------------- exact pure sums


def test_ten_thousand_small_spends_sum_to_exactly_one() -> None:
    events = [laplace("0.0001")] * 10_000
    c = compose(events)
    assert c.name == EXACT_SUM
    assert c.epsilon() == Decimal(1)
    assert c.epsilon(1e-6) == Decimal(1)  # δ buys nothing in the exact regime
    assert c.delta(1) == 0.0
    assert sum([1e-4] * 10_000) != 1.0  # what the float ledger did


def test_float_epsilons_are_read_as_the_decimal_they_print() -> None:
    c = compose([laplace(0.1)] * 10 + [laplace(0.2, mechanism="counts")])
    assert c.epsilon() == Decimal("1.2")
    assert c.to_dict(delta=0)["epsilon"] == "1.2"


def test_count_is_repetition() -> None:
    assert compose([laplace("0.3", count=7)]).epsilon() == Decimal("2.1")


def test_pure_parallel_composition_charges_the_worst_class() -> None:
    events = [laplace("1")] + [
        laplace("0.5", partition=c, count=n, mechanism="kde") for c, n in (("a", 2), ("b", 3))
    ]
    assert compose(events).epsilon() == Decimal("2.5")


def test_pure_delta_below_the_sum_is_positive_and_shrinks() -> None:
    c = compose([laplace("1")] * 4)
    assert c.delta(4) == 0.0
    assert 0 < c.delta(3.5) < c.delta(3) < 1


# ---------------------------------------------------------------- δ spent outright


def test_delta_spent_outright_is_taken_off_the_target_sequentially() -> None:
    c = compose([laplace("0.5", delta="1e-7")] * 2 + [laplace("0.5", delta="2e-7")])
    assert c.name == EXACT_SUM and not c.is_pure
    assert c.spends_delta == Fraction(4, 10**7)
    assert c.epsilon("1e-6") == Decimal("1.5")  # the pure sum, with δ = 4e-7 spent
    assert c.epsilon(Decimal("4e-7")) == Decimal("1.5")  # exactly enough: the pure part
    assert c.epsilon("3.9999999e-7").is_infinite()  # not enough δ: no finite ε
    assert c.epsilon(0).is_infinite()
    assert c.to_dict(delta="1e-7")["epsilon"] is None
    assert c.delta("1.5") == pytest.approx(4e-7, rel=1e-12)
    assert c.delta("1.5") >= 4e-7
    assert c.delta("1.4") > 4e-7  # below the pure sum the rest spends δ too
    # with a Gaussian: ε at δ is the rest's ε at δ − Σδ_i, to the last digit (powers of
    # two keep the difference exact in floats)
    target, spent = 2.0**-20, 4 * 2.0**-24
    gauss = gaussian(5.0, count=10)
    mixed = compose([gauss, laplace("0.5", delta=str(Decimal(2.0**-24)), count=4)])
    rest = compose([gauss, laplace("0.5", count=4)])
    assert mixed.name == PLD_NAME
    assert mixed.epsilon(target) == rest.epsilon(target - spent)
    assert mixed.epsilon(target) > rest.epsilon(target)
    assert mixed.epsilon(spent).is_infinite()  # δ all spent: the Gaussian gets none
    assert mixed.delta(3) == pytest.approx(rest.delta(3) + spent, rel=1e-9)


def test_delta_spent_outright_in_parallel_is_the_chosen_partitions() -> None:
    # class a spends more ε, class b more δ: the figure pairs them per class
    events = [
        laplace("0.5", partition="a", count=2, mechanism="ld", delta="1e-7"),
        laplace("0.5", partition="b", mechanism="ld", delta="3e-7"),
    ]
    c = compose(events)
    assert c.spends_delta == Fraction(3, 10**7)  # the worst class's, not the sum 5e-7
    assert c.epsilon("3e-7") == Decimal(1)
    assert c.epsilon("2.5e-7").is_infinite()  # class b's releases need 3e-7
    with_whole = compose([*events, laplace("1", delta="1e-7")])
    assert with_whole.spends_delta == Fraction(4, 10**7)
    assert with_whole.epsilon("4e-7") == Decimal(2)
    assert with_whole.epsilon("3.5e-7").is_infinite()
    # Gaussian classes: each choice composes at the δ its own releases leave
    delta, spent = 2.0**-20, 2.0**-20 - 2.0**-30
    uneven = compose(
        [
            gaussian(5.0, partition="a", delta=str(Decimal(spent))),
            gaussian(5.0, count=2, partition="a"),
            gaussian(5.0, count=4, partition="b"),
        ]
    )
    a = compose([gaussian(5.0, count=3)]).epsilon(delta - spent)
    b = compose([gaussian(5.0, count=4)]).epsilon(delta)
    assert a > b  # class a is the worse at this δ, though it makes fewer releases
    assert uneven.epsilon(delta) == a
    # a class whose releases are fewer but spend δ is not dropped as "contained"
    contained = compose(
        [
            laplace("0.5", partition="a", mechanism="ld", delta="2e-7"),
            laplace("0.5", partition="b", count=2, mechanism="ld"),
        ]
    )
    assert contained.epsilon("1e-7").is_infinite()
    assert contained.epsilon("2e-7") == Decimal(1)


# ---------------------------------------------------------------- PLD for Gaussians


@pytest.mark.parametrize(("epsilon", "delta"), [(1.0, 1e-5), (0.25, 1e-6), (4.0, 1e-8)])
def test_one_gaussian_at_its_analytic_sigma_gives_back_epsilon(
    epsilon: float, delta: float
) -> None:
    sigma = dp_accounting.get_sigma_gaussian(epsilon, delta)  # Balle & Wang, closed form
    c = compose([gaussian(sigma, sensitivity=1.0)])
    assert c.name == PLD_NAME
    got = float(c.epsilon(delta))
    assert got >= epsilon * (1 - 1e-9)  # pessimistic: never below the truth
    assert got == pytest.approx(epsilon, rel=1e-3)
    assert c.delta(epsilon * 1.01) <= delta


@pytest.mark.parametrize(
    ("n", "sigma", "printed"),
    [(75_316, 13.26, 0.9992), (8_396, 11.60, 1.0000), (1_939_290, 15.34, 1.0045)],
)
def test_aug_pe_noise_multipliers_give_the_published_epsilon(
    n: int, sigma: float, printed: float
) -> None:
    # T = 10 iterations, one Gaussian per label per iteration, labels in parallel.
    events = [gaussian(sigma, count=10, partition=label) for label in ("pos", "neg")]
    got = float(compose(events).epsilon(aug_pe_delta(n)))
    assert got == pytest.approx(printed, abs=1e-4)
    exact = dp_accounting.get_epsilon_gaussian(sigma / math.sqrt(10), aug_pe_delta(n))
    assert exact <= got <= exact + 1e-6


def test_pld_is_tighter_than_rdp_for_the_aug_pe_setting() -> None:
    delta = aug_pe_delta(75_316)
    rdp_accountant = rdp.RdpAccountant()
    rdp_accountant.compose(dp_accounting.GaussianDpEvent(13.26), 10)
    pld = float(compose([gaussian(13.26, count=10)]).epsilon(delta))
    assert rdp_accountant.get_epsilon(delta) > 1.05 * pld


def test_gaussian_repetitions_merge_exactly() -> None:
    delta = 1e-6
    merged = compose([gaussian(4.0, sensitivity=2.0, count=9)]).epsilon(delta)
    separate = compose([gaussian(4.0, sensitivity=2.0)] * 9).epsilon(delta)
    assert merged == separate
    # nine Gaussians of μ = 1/2 are one Gaussian of μ = 3/2 (Dong, Roth & Su, Cor. 3.3)
    assert float(merged) == pytest.approx(
        dp_accounting.get_epsilon_gaussian(2 / 3, delta), abs=1e-6
    )


def test_gaussian_needs_delta() -> None:
    c = compose([gaussian(3.0)])
    assert c.epsilon(0).is_infinite()
    assert c.to_dict(delta=0)["epsilon"] is None
    with pytest.raises(ConfigError) as err:
        c.epsilon(1.5)
    assert err.value.field == "delta"


def test_gaussian_parallel_composition_over_classes() -> None:
    delta = 1e-6
    one = compose([gaussian(5.0, count=3)]).epsilon(delta)
    same = compose([gaussian(5.0, count=3, partition=c) for c in "abcd"]).epsilon(delta)
    assert same == one
    uneven = compose(
        [gaussian(5.0, count=3, partition="a"), gaussian(5.0, count=5, partition="b")]
    ).epsilon(delta)
    assert uneven == compose([gaussian(5.0, count=5)]).epsilon(delta)
    sequential = compose(
        [gaussian(5.0, count=3, mechanism="x"), gaussian(5.0, count=5, mechanism="y")]
    ).epsilon(delta)
    assert sequential == compose([gaussian(5.0, count=8)]).epsilon(delta)


def test_mixed_pure_and_gaussian() -> None:
    delta = 1e-6
    pure = [laplace("1"), laplace("0.5", partition="a", mechanism="kde")]
    gauss = [gaussian(5.0, count=10)]
    c = compose(pure + gauss)
    assert c.name == PLD_NAME
    alone = compose(gauss).epsilon(delta)
    mixed = c.epsilon(delta)
    assert alone < mixed <= alone + Decimal("1.5")
    assert mixed < alone + Decimal("1.5") - Decimal("0.01")  # PLD composes, not adds
    assert c.delta(float(mixed)) <= delta * (1 + 1e-6)
    assert c.delta(float(mixed) - 0.05) > delta


def test_little_noise_is_accounted_fast_by_the_sum_bound() -> None:
    # μ = 20: a PLD would take ~20 s to build; the closed form and the exact sum do not.
    start = time.perf_counter()
    c = compose([laplace("2"), gaussian(0.05)])
    got = c.epsilon(1e-6)
    assert time.perf_counter() - start < 2
    exact = dp_accounting.get_epsilon_gaussian(0.05, 1e-6)
    assert 2 + exact <= float(got) <= 2 + exact + 1e-8
    assert c.delta(float(got)) <= 1e-6


def test_discrete_gaussian_matches_dp_accounting_and_the_continuous_one() -> None:
    delta = 1e-6
    count = PrivacyEvent(
        mechanism="class-counts",
        noise="discrete_gaussian",
        scale=5.0,
        sensitivity=1,
        norm="l2",
        dimension=1,
        count=10,
    )
    got = float(compose([count]).epsilon(delta))
    from dp_accounting.pld import privacy_loss_distribution as pld

    direct = pld.from_discrete_gaussian_mechanism(5.0, sensitivity=1).self_compose(10)
    assert got == pytest.approx(direct.get_epsilon_for_delta(delta), abs=1e-8)
    continuous = dp_accounting.get_epsilon_gaussian(5.0 / math.sqrt(10), delta)
    assert got == pytest.approx(continuous, rel=0.01)
    # a vector moving 10 coordinates by ≤ 1 costs the same as ten 1-D releases
    vector = PrivacyEvent(
        mechanism="presence",
        noise="discrete_gaussian",
        scale=5.0,
        sensitivity=math.sqrt(10),
        norm="l2",
        dimension=300,
    )
    assert compose([vector]).epsilon(delta) == compose([count]).epsilon(delta)


def test_many_partition_choices_fall_back_to_a_valid_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Classes that are not comparable (a pure spend vs a Gaussian one): every choice of
    # one class per group is evaluated, unless there are too many.
    delta = 1e-6
    kde = [
        laplace("1", partition="a", mechanism="kde"),
        gaussian(3.0, partition="b", mechanism="kde"),
    ]
    counts = [
        laplace("0.5", partition="a", mechanism="counts"),
        gaussian(6.0, partition="b", mechanism="counts"),
    ]
    events = kde + counts
    assert len(accountant._choices(plan_composition(events))) == 4
    exact = compose(events).epsilon(delta)
    worst = max(compose([x, y]).epsilon(delta) for x in kde for y in counts)
    assert exact == worst
    monkeypatch.setattr(accountant, "MAX_CHOICES", 1)
    bounded = compose(events).epsilon(delta)
    unpartitioned = [PrivacyEvent.from_dict({**e.to_dict(), "partition": None}) for e in events]
    assert exact < bounded <= compose(unpartitioned).epsilon(delta)


def test_a_class_whose_events_are_contained_in_another_is_not_evaluated() -> None:
    events = [
        gaussian(4.0, partition="a"),
        gaussian(4.0, partition="b"),
        gaussian(9.0, partition="b"),
    ]
    plan = plan_composition(events)
    assert len(accountant._choices(plan)) == 1


# ---------------------------------------------------------------- sets of jobs


def test_dataset_ledger_is_the_union_of_its_jobs() -> None:
    delta = 1e-6
    job = [
        laplace("1"),
        gaussian(8.0, count=5, partition="a", mechanism="kde"),
        gaussian(8.0, count=5, partition="b", mechanism="kde"),
    ]
    ledger = compose_jobs([job, job, job])
    assert ledger.epsilon(delta) == compose(job * 3).epsilon(delta)
    assert ledger.epsilon(delta) == compose(
        [laplace("1", count=3), gaussian(8.0, count=15)]
    ).epsilon(delta)


def test_organisation_over_datasets() -> None:
    a, b = [laplace("1"), laplace("2")], [laplace("2.5")]
    assert compose_datasets([a, b], disjoint=False).epsilon() == Decimal("5.5")
    assert compose_datasets([a, b], disjoint=True).epsilon() == Decimal(3)
    mixed = compose_datasets([a, [gaussian(1.0)]], disjoint=True)
    assert mixed.name == PLD_NAME
    assert mixed.epsilon(1e-6) == compose([gaussian(1.0)]).epsilon(1e-6) > 3


def test_hundred_jobs_of_three_events_compose_fast() -> None:
    jobs = [
        [
            laplace("0.5"),
            gaussian(20.0, count=10, partition="a"),
            gaussian(20.0, count=10, partition="b"),
        ]
        for _ in range(100)
    ]
    start = time.perf_counter()
    first = compose_jobs(jobs).epsilon(1e-6)
    cold = time.perf_counter() - start
    start = time.perf_counter()
    again = compose_jobs(jobs).epsilon(1e-6)
    warm = time.perf_counter() - start
    assert first == again
    assert cold < 15 and warm < 2, (cold, warm)


@pytest.mark.parametrize("module", [events_module, accountant, calibration])
def test_doctests_hold(module: object) -> None:
    assert doctest.testmod(module, raise_on_error=True).attempted >= 2  # type: ignore[arg-type]


# ---------------------------------------------------------------- calibration


def scipy_analytic_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Balle & Wang 2018, Thm. 8, solved independently of dp-accounting."""

    def delta_of(sigma: float) -> float:
        a, b = sensitivity / (2 * sigma), epsilon * sigma / sensitivity
        return float(norm.cdf(a - b) - math.exp(epsilon) * norm.cdf(-a - b))

    return float(brentq(lambda s: delta_of(s) - delta, 1e-3, 1e4, xtol=1e-13, rtol=1e-13))


@pytest.mark.parametrize(
    ("epsilon", "delta", "sensitivity"),
    [(1.0, 1e-5, 1.0), (0.25, 1e-6, 1.0), (0.1, 1e-6, 3.0), (5.0, 1e-8, 0.5), (8.0, 1e-3, 2.0)],
)
def test_analytic_gaussian_sigma_matches_an_independent_scipy_solution(
    epsilon: float, delta: float, sensitivity: float
) -> None:
    sigma = analytic_gaussian_sigma(epsilon=epsilon, delta=delta, sensitivity=sensitivity)
    expected = scipy_analytic_sigma(epsilon, delta, sensitivity)
    assert sigma == pytest.approx(expected, rel=1e-8)
    assert sigma >= expected * (1 - 1e-10)
    # the classical bound √(2 ln(1.25/δ))·Δ/ε is looser wherever it applies (ε ≤ 1)
    if epsilon <= 1:
        assert sigma < math.sqrt(2 * math.log(1.25 / delta)) * sensitivity / epsilon


@pytest.mark.parametrize(("n", "published"), [(75_316, 13.26), (8_396, 11.60)])
def test_private_evolution_noise_multipliers(n: int, published: float) -> None:
    z = gaussian_noise_multiplier(epsilon=1.0, delta=aug_pe_delta(n), steps=10)
    assert z == pytest.approx(published, rel=0.01)
    assert math.ceil(z * 100) / 100 == published  # the README rounds up to two decimals
    # the accountant certifies it, and 0.1 % less noise would not do
    events = [gaussian(z, count=10)]
    assert compose(events).epsilon(aug_pe_delta(n)) <= 1
    assert compose([gaussian(z * 0.999, count=10)]).epsilon(aug_pe_delta(n)) > 1


def test_calibration_respects_parallel_classes_and_fixed_events() -> None:
    delta = 1e-6
    alone = calibrate_noise_multiplier(
        epsilon=2.0, delta=delta, releases=[GaussianRelease("kde", 1.0, count=4)]
    )
    classes = calibrate_noise_multiplier(
        epsilon=2.0,
        delta=delta,
        releases=[GaussianRelease("kde", 1.0, count=4, partitions=("a", "b", "c"))],
    )
    assert classes == pytest.approx(alone, rel=2e-4)  # classes in parallel cost nothing more
    with_pure = calibrate_noise_multiplier(
        epsilon=2.0,
        delta=delta,
        releases=[GaussianRelease("kde", 1.0, count=4)],
        fixed=[laplace("1")],
    )
    assert with_pure > alone
    got = compose([laplace("1"), gaussian(with_pure, count=4, mechanism="kde")]).epsilon(delta)
    assert Decimal("1.99") < got <= 2


def test_calibration_refuses_impossible_targets() -> None:
    with pytest.raises(ConfigError) as err:
        calibrate_noise_multiplier(
            epsilon=1.0, delta=1e-6, releases=[GaussianRelease("kde", 1.0)], fixed=[laplace("1")]
        )
    assert err.value.field == "epsilon"
    with pytest.raises(ConfigError) as err:
        gaussian_noise_multiplier(epsilon=1.0, delta=0.0, steps=3)
    assert err.value.field == "delta"
    with pytest.raises(ConfigError) as err:
        gaussian_noise_multiplier(epsilon=1.0, delta=1e-6, steps=0)
    assert err.value.field == "steps"


def test_split_budget_by_shares() -> None:
    plan = split_budget(
        epsilon=3.0,
        delta=0.0,
        mechanisms=[
            PlannedMechanism("vocabulary-histogram", "discrete_laplace", 4, "l1", 1000, share=1),
            PlannedMechanism(
                "kde", "laplace", 2.0, "l1", 64, share=2, count=4, partitions=("a", "b")
            ),
        ],
    )
    assert plan.composition.name == EXACT_SUM
    assert plan.epsilon == Decimal(3)
    assert plan.scale("vocabulary-histogram") == pytest.approx(4.0)
    assert plan.scale("kde") == pytest.approx(2.0 * 4 / 2.0)  # ε 2 over 4 releases
    thirds = split_budget(
        epsilon=1.0,
        delta=0.0,
        mechanisms=[PlannedMechanism(name, "laplace", 1.0, "l1", 1) for name in ("x", "y", "z")],
    )
    assert Decimal("0.999999999999") <= thirds.epsilon <= 1  # rounded down, never over


def test_split_budget_mixes_pure_and_gaussian_within_the_target() -> None:
    plan = split_budget(
        epsilon=1.0,
        delta=1e-6,
        mechanisms=[
            PlannedMechanism("vocabulary-histogram", "discrete_laplace", 4, "l1", 1000, share=1),
            PlannedMechanism("kde", "gaussian", 1.0, "l2", 4096, share=4, partitions=("a", "b")),
            PlannedMechanism("counts", "gaussian", 1.0, "l2", 3, share=1),
        ],
    )
    assert plan.composition.name == PLD_NAME
    assert Decimal("0.99") < plan.epsilon <= 1
    vocabulary = [e for e in plan.events if e.mechanism == "vocabulary-histogram"]
    assert vocabulary[0].epsilon == Decimal("0.166666666666")
    # μ² shares: the kde gets 4× the counts' μ², so half the counts' σ
    assert plan.scale("counts") == pytest.approx(2 * plan.scale("kde"), rel=1e-9)
    assert json.loads(json.dumps(plan.composition.to_dict(delta=1e-6)))["events"]


def test_split_budget_refuses_gaussians_without_delta() -> None:
    with pytest.raises(ConfigError) as err:
        split_budget(
            epsilon=1.0, delta=0.0, mechanisms=[PlannedMechanism("kde", "gaussian", 1.0, "l2", 8)]
        )
    assert err.value.field == "delta"
