"""How the dashboard writes figures and words (app/admin/formatting.py), without a server."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from markupsafe import Markup

from app.admin import formatting
from app.admin.templating import environment
from workers.privacy.accountant import EXACT_SUM, PLD_NAME


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (0.999999418, "1.00"),  # rounded: the padding zeros say so
        (1.0, "1"),
        (5.0, "5"),
        (0.5, "0.5"),
        (1.05, "1.05"),
        (1 / 3, "0.333"),
        (2 / 3, "0.667"),
        (0.1 + 0.2, "0.300"),
        (3.14159, "3.14"),
        (9.995, "10.0"),  # rounding up carries into the next power of ten
        (123.456, "123"),
        (1234.5, "1230"),
        (0.001, "0.001"),
        (0.0012345, "0.00123"),
        (1e-6, "1 × 10⁻⁶"),
        (1.2345e-6, "1.23 × 10⁻⁶"),
        (1e-12, "1 × 10⁻¹²"),
        (2.5e6, "2.5 × 10⁶"),
        (-0.25, "-0.25"),
        (0.0, "0"),
        (-0.0, "0"),
        (Decimal("0.999999418000"), "1.00"),
        (Decimal("0.050000000000"), "0.05"),
        (float("inf"), "∞"),
        (None, "—"),
    ],
)
def test_three_significant_figures(value: float | Decimal | None, shown: str) -> None:
    assert formatting.significant(value) == shown


def test_a_figure_shows_3_significant_figures_and_holds_the_exact_value() -> None:
    html = formatting.figure(0.999999418)
    assert isinstance(html, Markup)
    assert html == ('<span class="fig" title="0.999999418" data-exact="0.999999418">1.00</span>')
    # the exact text is the API's JSON number (the float's shortest repr)
    assert formatting.figure(Decimal("0.100000000000")).count('"0.1"') == 2
    assert 'title="1e-06" data-exact="1e-06">1 × 10⁻⁶<' in formatting.figure(1e-6)
    assert formatting.figure(5.0, "epsilon_cap") == (
        '<span class="fig" data-field="epsilon_cap" title="5" data-exact="5">5</span>'
    )
    # through the template filter, autoescaped pages keep it as markup
    rendered = environment.from_string("{{ x|fig }} {{ y|fig('spent') }}").render(x=1e-6, y=2 / 3)
    assert re.findall(r'data-exact="([^"]+)">([^<]+)<', rendered) == [
        ("1e-06", "1 × 10⁻⁶"),
        ("0.6666666666666666", "0.667"),
    ]


def test_mechanism_figures_escape_their_names() -> None:
    html = formatting.mechanisms({"kde<b>": 0.123456, "vocabulary": 0.5})
    assert "kde&lt;b&gt; " in html and "<b>" not in html
    assert 'data-exact="0.123456">0.123<' in html and 'data-exact="0.5">0.5<' in html


def test_one_word_for_each_meaning_of_release() -> None:
    assert formatting.entry_kind("release") == "reservation freed"
    assert formatting.entry_kind("commit") == "commit (spent)"
    assert formatting.budget_state("released") == "reservation freed"
    assert formatting.budget_state("committed") == "spent"
    assert (
        formatting.audit_kind("release.created") == "release.created (corpus released to clients)"
    )
    assert formatting.audit_kind("job.submitted") == "job.submitted"


def test_accountants_are_named_as_the_ledger_names_them() -> None:
    assert formatting.accountants([]) == [EXACT_SUM, PLD_NAME]  # a page without figures
    assert formatting.accountants([PLD_NAME, EXACT_SUM, PLD_NAME]) == sorted({EXACT_SUM, PLD_NAME})
    assert formatting.accountant(EXACT_SUM).startswith("exact-sum: every noisy release is pure")
    assert formatting.accountant(PLD_NAME).startswith(f"{PLD_NAME}: Gaussian noise is in")
    assert "basic composition" not in formatting.accountant(PLD_NAME)


def test_a_cap_far_above_the_spend_is_named_not_drawn() -> None:
    from datetime import UTC, datetime, timedelta

    from app.admin.chart import Point, _chart

    start = datetime(2026, 1, 1, tzinfo=UTC)
    points = [
        Point(start, 0.0, 0.5, 0.0),
        Point(start + timedelta(hours=1), 0.999999418, 0.999999418, 1e-6, "spent"),
    ]
    near = _chart(3.0, 1e-6, points, "cap")
    assert near.cap_shown and near.cap_label == "cap ε = 3"
    assert [t.label for t in near.y_ticks] == ["0", "1.5", "3"]
    assert [(t.label, t.exact) for t in near.delta_ticks] == [("0", "0"), ("1 × 10⁻⁶", "1e-06")]
    assert near.final_delta == 1e-6 and not near.pure
    far = _chart(100_000.0, 1e-3, points, "budget")
    assert not far.cap_shown and far.cap_label == "budget ε = 100000 (far above: not to scale)"
    assert [t.exact for t in far.y_ticks] == ["0", "0.499999709", "0.999999418"]
    assert far.markers[0].y > far.top  # the spend is drawn inside the axis, not flattened
    pure = _chart(1.0, 0.0, [Point(start, 0.5, 0.5, 0.0)], "cap")
    assert pure.pure and [t.label for t in pure.delta_ticks] == ["0"]
