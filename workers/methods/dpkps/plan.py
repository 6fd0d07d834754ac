"""The releases a DP-KPS run will make, and their noise, before any private read.

:func:`plan` turns a configuration and the public facts of a job (declared labels, size
of the public vocabulary) into the :class:`~workers.privacy.events.PrivacyEvent` list the
run will produce, through the shared budget split (:func:`workers.privacy.calibration.
split_budget`). The ledger reserves these events, a dry run shows them, and the engine
draws its noise from them: a mechanism's noise scale is its planned scale per unit of
sensitivity (ε⁻¹ for Laplace, the noise multiplier σ/Δ for Gaussians) times the
sensitivity it meets at run time.

The releases (adjacency: one privacy unit — a row, or a patient with a unit column —
added or removed):

==================  ====================  ===================  =====================
mechanism           Laplace (pure ε)      Gaussian (ε, δ)      dimension, partitions
==================  ====================  ===================  =====================
``vocabulary``      discrete, L1 Δ = S    L2 Δ = √S            |V|, whole corpus
``class_counts``    discrete, L1 Δ = 1    L2 Δ = 1             #labels, whole corpus
``kde``             L1 (see below)        L2 (see below)       per class, in parallel
``kde_cells``       –                     L2 Δ = 1             K_max·384, per class
==================  ====================  ===================  =====================

A public Ṽ (``vocabulary_method = "public"``) makes no ``vocabulary`` release. Class
centroids (``kde_method = "centroid"``, Gaussian only) release per class the sum of the
units' document embeddings, L2 Δ = 1 in 384 coordinates; ``"moments"`` adds the upper
triangle of the sum of their outer products, L2 Δ = √2
(:mod:`workers.methods.dpkps.density.centroid`).
With cells (``centroid_cells`` > 1, by default from ε = 4 on) the class sum takes
``cell_share`` of the KDE's share and a second release, ``kde_cells``, the rest: each
unit's vector in the one cell of its class that the first release placed nearest it.

The KDE's sensitivity is c·I (L1) or c·√I (L2) for random features, known here; for the
exact kernel it is the largest column sum (L1) or column norm (L2) of the kernel on Ṽ,
which exists only once Ṽ is released. Such an event is planned with sensitivity 1 (its
noise per unit of sensitivity is what the accountant needs: ε for Laplace, σ/Δ for
Gaussians) and the run records the real sensitivity with a proportional scale;
:func:`matches` checks that the run made exactly the planned releases.

Thresholded vocabulary (``vocabulary_method = "threshold"``, Gaussian noise only): the
vocabulary histogram is released on the phrases that occur, and only those above a
threshold stay (:mod:`workers.methods.dpkps.private_vocab`). Its event is the Gaussian
(L2 Δ = √S) with ``delta`` = δ_thr (:data:`THRESHOLD_DELTA_SHARE` of δ), the chance that
a phrase held by the added unit alone crosses the threshold, spent outright. The
accountant takes δ_thr off the run's δ and composes the Gaussians at δ − δ_thr, so the
events alone — what the ledger reserves and composes — come to the run's (ε, δ), δ_thr
counted once (``private_vocab``'s docstring has the argument, which needs no ε of its
own for the threshold).

A Poisson sample of units (``embed_sample`` > 0, class centroids or moments) changes no
release: each class's sum is over the units sampled, with the planned Gaussian at L2
Δ = 1, and the ledger charges it as the Gaussian on every unit (sampling never raises the
privacy loss; ``workers/privacy/sampling.py`` has the argument, and why no amplification
is claimed). The rate comes from the class counts, which such a run releases even without
a total (``class_counts`` with ``SAMPLE_COUNT_SHARE`` of μ²).

Default shares (``share_vocab`` = ``share_kde`` = 1, ``share_count`` = 0.1): on AG News at
ε = 1 an even vocabulary/KDE split beat 0.2/0.8 (0.635 against 0.497 synthetic accuracy,
landed code, Laplace), because at low ε the private vocabulary is the bottleneck; the
class counts need little (a total split by counts tolerates their noise).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from workers.errors import ConfigError
from workers.methods.dpkps.config import (
    EMBEDDING_DIMENSION,
    GenerationConfig,
    ensemble_block_counts,
    moments_dimension,
)
from workers.privacy.accountant import compose
from workers.privacy.calibration import PlannedMechanism, split_budget
from workers.privacy.events import PrivacyEvent

VOCABULARY, CLASS_COUNTS, KDE = "vocabulary", "class_counts", "kde"
CELLS = "kde_cells"  # the second release of class centroids with cells
RELATIVE_TOLERANCE = 1e-9  # planned against realised noise per unit of sensitivity
# Share of the run's δ spent on the vocabulary threshold (a phrase of the added unit alone
# crossing it); the Gaussians get the rest. T grows like √(2 ln(S/δ_thr)): halving δ_thr
# moves T by ~2 % and costs the Gaussians little, so an even split is near optimal.
THRESHOLD_DELTA_SHARE = 0.5


def kde_structures(config: GenerationConfig) -> int:
    """How many KDE releases one class makes (an iterative run's ensemble, else one)."""
    if config.mode == "iterative":
        return len(ensemble_block_counts(config.ensemble, config.sequence_length))
    return 1


def kde_sensitivity(config: GenerationConfig) -> float:
    """The KDE's sensitivity where it is known before the run (random features), else 1."""
    if config.density_method == "exact":
        return 1.0  # normalised: the kernel's real sensitivity depends on Ṽ
    if config.density_method == "centroid":
        return 1.0  # a sum of vectors of norm ≤ 1: L2 Δ = 1
    if config.density_method == "moments":
        return math.sqrt(2.0)  # and their outer products: √(‖x‖² + ‖x‖⁴) ≤ √2
    i = config.num_features
    c = config.contribution_bound
    return c * i if config.noise == "laplace" else c * math.sqrt(i)


def _mechanisms(
    config: GenerationConfig, label_set: Sequence[str], vocabulary_size: int
) -> list[PlannedMechanism]:
    threshold = threshold_delta(config)
    gaussian = config.noise == "gaussian"
    per = config.epsilon is None  # per-mechanism ε: the shares are the ε themselves
    s = config.max_matches_per_document
    out = []
    if config.vocabulary_selection != "public":  # a public Ṽ is no release
        out.append(
            PlannedMechanism(
                mechanism=VOCABULARY,
                noise="gaussian" if gaussian else "discrete_laplace",
                sensitivity=math.sqrt(s) if gaussian else float(s),
                norm="l2" if gaussian else "l1",
                dimension=vocabulary_size,
                share=float(config.epsilon_vocab if per else config.share_vocab),  # type: ignore[arg-type]
                delta=threshold or None,
            )
        )
    if config.releases_class_counts:
        out.append(
            PlannedMechanism(
                mechanism=CLASS_COUNTS,
                noise="gaussian" if gaussian else "discrete_laplace",
                sensitivity=1.0,
                norm="l2" if gaussian else "l1",
                dimension=len(label_set),
                share=float(config.epsilon_count if per else config.count_share),  # type: ignore[arg-type]
            )
        )
    exact = config.density_method == "exact"
    kde_share = float(config.epsilon_kde if per else config.share_kde)  # type: ignore[arg-type]
    cells = config.cells
    if cells > 1:  # the class sum takes cell_share of the KDE's share, the cells the rest
        out.append(
            PlannedMechanism(
                mechanism=CELLS,
                noise="gaussian",
                sensitivity=1.0,  # a unit is in one cell of one class
                norm="l2",
                dimension=cells * config.release_dimension,
                share=kde_share * (1.0 - config.cell_share),
                partitions=tuple(label_set),
            )
        )
        kde_share *= config.cell_share
    out.append(
        PlannedMechanism(
            mechanism=KDE,
            noise="gaussian" if gaussian else "laplace",
            sensitivity=kde_sensitivity(config),
            norm="l2" if gaussian else "l1",
            dimension=(
                config.candidate_count
                if exact
                else config.release_dimension
                if config.density_method == "centroid"
                else moments_dimension(EMBEDDING_DIMENSION)
                if config.density_method == "moments"
                else config.num_features
            ),
            share=kde_share,
            count=kde_structures(config),
            partitions=tuple(label_set),
        )
    )
    return out


@dataclass(frozen=True)
class Plan:
    """The planned releases of one run and the (ε, δ) they compose to."""

    events: tuple[PrivacyEvent, ...]
    epsilon: Decimal
    delta: float
    accountant: str

    @property
    def threshold_delta(self) -> float:
        """δ_thr of a thresholded vocabulary: the ``delta`` its event spends (0 otherwise)."""
        for event in self.events:
            if event.mechanism == VOCABULARY and event.delta is not None:
                return float(event.delta)
        return 0.0

    def noise_per_sensitivity(self, mechanism: str) -> float:
        """Scale / sensitivity of ``mechanism`` (1/ε for Laplace, σ/Δ for Gaussians)."""
        for event in self.events:
            if event.mechanism == mechanism:
                return event.scale / event.sensitivity
        raise ConfigError(f"the plan has no {mechanism!r} release", field="mechanism")

    def epsilon_of(self, mechanism: str) -> float:
        """ε of one release of a pure ``mechanism`` (as planned, exact decimal)."""
        for event in self.events:
            if event.mechanism == mechanism and event.epsilon is not None:
                return float(event.epsilon)
        raise ConfigError(f"the plan has no pure {mechanism!r} release", field="mechanism")

    def to_dict(self) -> dict[str, Any]:
        return {
            "epsilon": str(self.epsilon),
            "delta": self.delta,
            "accountant": self.accountant,
            "events": [e.to_dict() for e in self.events],
        }


def threshold_delta(config: GenerationConfig) -> float:
    """δ_thr of the vocabulary threshold: 0 unless the run thresholds its vocabulary."""
    if config.vocabulary_selection != "threshold":
        return 0.0
    return THRESHOLD_DELTA_SHARE * config.delta


def plan(config: GenerationConfig, label_set: Sequence[str], vocabulary_size: int) -> Plan:
    """Every release of a run of ``config``, from public inputs only (no private read).

    The events carry every δ they spend outright (a thresholded vocabulary's), so they
    compose to the plan's (ε, δ) by themselves: ``compose(plan.events).epsilon(delta)``
    is ``plan.epsilon``.
    """
    config.validate()
    if not label_set:
        raise ConfigError("the label set is empty", field="labels")
    config = config.for_classes(len(label_set))  # the default subspace: by the label set
    mechanisms = _mechanisms(config, label_set, vocabulary_size)
    if config.epsilon is None:  # per-mechanism ε: their sum, each share its own ε
        total = math.fsum(m.share for m in mechanisms)
        split = split_budget(epsilon=total, delta=0.0, mechanisms=mechanisms)
    else:
        split = split_budget(epsilon=config.epsilon, delta=config.delta, mechanisms=mechanisms)
    return Plan(
        events=split.events,
        epsilon=split.epsilon,
        delta=split.delta,
        accountant=compose(split.events).name,
    )


def _signature(event: PrivacyEvent) -> tuple[Any, ...]:
    return (
        event.mechanism,
        event.noise,
        event.norm,
        event.dimension,
        event.partition,
        event.delta,
    )


def _cost(event: PrivacyEvent) -> float:
    """What the accountant reads of one release: its ε (pure) or σ/Δ (Gaussian)."""
    return float(event.epsilon) if event.epsilon is not None else event.scale / event.sensitivity


def _collapsed(events: Iterable[PrivacyEvent]) -> dict[tuple[Any, ...], list[tuple[float, int]]]:
    out: dict[tuple[Any, ...], list[tuple[float, int]]] = {}
    for event in events:
        costs = out.setdefault(_signature(event), [])
        cost = _cost(event)
        for i, (seen, count) in enumerate(costs):
            if abs(seen - cost) <= RELATIVE_TOLERANCE * seen:
                costs[i] = (seen, count + event.count)
                break
        else:
            costs.append((cost, event.count))
    return {key: sorted(value) for key, value in out.items()}


def matches(planned: Iterable[PrivacyEvent], realised: Iterable[PrivacyEvent]) -> bool:
    """Whether a run made exactly the planned releases (same cost, to 1e-9 relative, and
    the same δ spent outright)."""
    left, right = _collapsed(planned), _collapsed(realised)
    if left.keys() != right.keys():
        return False
    for key, costs in left.items():
        other = right[key]
        if [c for _, c in costs] != [c for _, c in other]:
            return False
        for (a, _), (b, _) in zip(costs, other, strict=True):
            if abs(a - b) > RELATIVE_TOLERANCE * a:
                return False
    return True
