"""The release report as a PDF, drawn with fpdf2 (pure Python: no browser at run time).

The same :class:`~app.releases.report.ReleaseReport` the JSON and the HTML page render.
ε, δ and other non-Latin-1 characters need a Unicode font: DejaVu Sans is used where it
is installed (Debian's ``fonts-dejavu-core``, at its usual paths); without it the text is
set in the PDF's built-in Helvetica with those characters spelled out ("epsilon").
"""

from __future__ import annotations

import json
from pathlib import Path

from fpdf import FPDF
from fpdf.enums import XPos, YPos

from app.releases.report import ReleaseReport

FONT_DIRS = (
    Path("/usr/share/fonts/truetype/dejavu"),
    Path("/usr/share/fonts/dejavu"),
    Path("/usr/local/share/fonts/dejavu"),
)
SPELLED = {"ε": "epsilon", "δ": "delta", "∞": "infinity", "–": "-", "—": "-", "·": "-", "≈": "~"}


def _font_dir() -> Path | None:
    for folder in FONT_DIRS:
        if (folder / "DejaVuSans.ttf").is_file() and (folder / "DejaVuSans-Bold.ttf").is_file():
            return folder
    return None


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def _eps(value: float | None) -> str:
    if value is None:
        return "∞"
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


class _Document(FPDF):
    def __init__(self) -> None:
        super().__init__(format="A4")
        folder = _font_dir()
        self.unicode = folder is not None
        if folder is not None:
            self.add_font("DejaVu", "", str(folder / "DejaVuSans.ttf"))
            self.add_font("DejaVu", "B", str(folder / "DejaVuSans-Bold.ttf"))
            self.family_name = "DejaVu"
        else:
            self.family_name = "Helvetica"
        self.set_auto_page_break(auto=True, margin=15)
        self.set_margins(18, 18, 18)

    def text_of(self, text: str) -> str:
        if self.unicode:
            return text
        for char, spelled in SPELLED.items():
            text = text.replace(char, spelled)
        return text.encode("latin-1", "replace").decode("latin-1")

    def footer(self) -> None:
        self.set_y(-12)
        self.set_font(self.family_name, "", 8)
        self.cell(0, 8, self.text_of(f"keyseed release report · page {self.page_no()}"), align="C")

    def heading(self, text: str) -> None:
        self.ln(3)
        self.set_font(self.family_name, "B", 13)
        self.multi_cell(0, 7, self.text_of(text), new_x=XPos.LMARGIN, new_y=YPos.NEXT)
        self.set_font(self.family_name, "", 10)

    def para(self, text: str, *, bold: bool = False, size: int = 10) -> None:
        self.set_font(self.family_name, "B" if bold else "", size)
        self.multi_cell(0, 5, self.text_of(text), align="L", new_x=XPos.LMARGIN, new_y=YPos.NEXT)
        self.set_font(self.family_name, "", 10)
        self.ln(1)

    def labelled(self, label: str, text: str) -> None:
        self.set_font(self.family_name, "B", 10)
        self.multi_cell(0, 5, self.text_of(label), new_x=XPos.LMARGIN, new_y=YPos.NEXT)
        self.para(text)

    def rows(self, header: list[str], rows: list[list[str]], widths: list[float]) -> None:
        self.set_font(self.family_name, "", 9)
        with self.table(
            col_widths=tuple(widths), text_align="LEFT", line_height=5, first_row_as_headings=True
        ) as table:
            for row in [header, *rows]:
                line = table.row()
                for value in row:
                    line.cell(self.text_of(value))
        self.set_font(self.family_name, "", 10)
        self.ln(2)


def render(report: ReleaseReport) -> bytes:
    r = report
    pdf = _Document()
    pdf.set_title(pdf.text_of(f"Release report: {r.released.name}"))
    pdf.set_author("keyseed")
    pdf.add_page()
    pdf.para(f"Release report: {r.released.name}", bold=True, size=16)
    pdf.para(r.view_in_words)
    pdf.para(
        f"{r.released.summary}. Released by {r.released.owner_organisation.name} on "
        f"{r.released.released_at:%Y-%m-%d %H:%M} UTC."
    )
    if r.released.classes_without_documents:
        pdf.para(
            f"Flag: {len(r.released.classes_without_documents)} of {len(r.released.classes)} "
            f"classes received no documents: {', '.join(r.released.classes_without_documents)}.",
            bold=True,
        )

    p = r.protection
    pdf.heading("What is protected")
    pdf.labelled("The unit of protection", p.unit_in_words)
    pdf.labelled(f"The guarantee: ε = {_eps(p.epsilon)}, δ = {p.delta:g}", p.guarantee_in_words)
    pdf.labelled("The accountant", p.accountant_in_words)
    pdf.labelled("Releases over classes", p.parallel_composition)

    a = r.empirical_audit
    pdf.heading("Empirical privacy evidence")
    if a is None:
        pdf.para("The job ran without canaries: no empirical audit.")
    else:
        pdf.rows(
            ["Claimed ε", "Audit: ε at least", "Confidence", "m canaries", "k guesses", "r right"],
            [
                [
                    _eps(a.claimed_epsilon),
                    _eps(a.epsilon_lower_bound),
                    f"{a.confidence:.0%}",
                    str(a.canaries),
                    str(a.guesses),
                    str(a.correct),
                ]
            ],
            [27, 33, 27, 29, 29, 29],
        )
        pdf.para(a.finding_in_words, bold=a.exceeds_claim)
        pdf.labelled("How", a.method)
        pdf.labelled("Canaries and the released data", a.canaries_in_release)
        pdf.labelled("Their cost to utility", a.utility_cost)

    s = r.spend
    pdf.heading("The spend")
    pdf.para(f"This release: ε = {_eps(s.epsilon)}, δ = {s.delta:g}. {s.note}")
    pdf.rows(
        ["Mechanism", "ε", "Releases", "Per class", "δ outright"],
        [
            [
                m.mechanism,
                _eps(m.epsilon),
                str(m.events),
                "yes (parallel)" if m.per_class else "no",
                f"{m.delta_spent_outright:g}",
            ]
            for m in s.by_mechanism
        ],
        [70, 25, 20, 30, 25],
    )
    if s.dataset is not None:
        d = s.dataset
        pdf.para(
            f"The dataset's cap is ε = {_eps(d.epsilon_cap)} at δ = {d.delta_cap:g}. Spent after "
            f"this release: ε = {_eps(d.spent_after_this_release)}; today: ε = "
            f"{_eps(d.spent_now)} spent, {_eps(d.reserved_now)} reserved, "
            f"{_eps(d.remaining_now)} left ({d.accountant})."
        )
    else:
        pdf.para(
            "The dataset's ledger and the organisation's budget are shown to the owner "
            "organisation and the platform roles."
        )
    if s.organisation_budget is not None:
        o = s.organisation_budget
        pdf.para(
            f"The organisation's budget is ε = {_eps(o.budget.epsilon)} at δ = "
            f"{o.budget.delta:g}; its datasets' caps take ε = {_eps(o.allocated.epsilon)}, "
            f"ε = {_eps(o.remaining.epsilon)} is left for new caps; its datasets have spent "
            f"ε = {_eps(o.spent)} ({o.accountant})."
        )

    rel = r.released
    pdf.heading("What was released, to whom, when")
    pdf.para(
        f"Dataset {rel.dataset_name}; job {rel.job_id}; released by {rel.released_by} to "
        f"{', '.join(g.name for g in rel.grantees)}."
    )
    if rel.dataset_raw_counts is not None:
        raw = rel.dataset_raw_counts
        pdf.para(
            f"Your upload (not shown to anyone else; not DP): {raw['documents']} documents "
            f"stored, {raw['skipped_empty']} empty and {raw['skipped_duplicate']} repeated "
            "rows skipped."
        )
    pdf.rows(
        ["Class", "Asked", "Drawn", "Released", "Note"],
        [
            [
                c.label,
                "–" if c.asked is None else str(c.asked),
                str(c.drawn),
                str(c.released),
                "NO DOCUMENTS" if c.flagged else "",
            ]
            for c in rel.classes
        ],
        [70, 20, 20, 25, 35],
    )

    pdf.heading("What the data is good for")
    pdf.para(r.what_the_data_is_good_for)

    if r.utility is not None:
        u = r.utility
        pdf.heading("Accuracy on held-out private data")
        pdf.para(u.in_words)
        pdf.rows(
            ["Class", "Units", "Accuracy", "Interval or why not"],
            [
                [
                    c.label,
                    str(c.units),
                    "–" if c.accuracy is None else f"{c.accuracy:.3f}",
                    f"[{c.interval[0]:.3f}, {c.interval[1]:.3f}]"
                    if c.interval
                    else c.why_not or "",
                ]
                for c in u.per_class
            ],
            [40, 20, 25, 89],
        )

    v = r.provenance
    pdf.heading("Provenance")
    pdf.para(f"Method: {v.method} ({v.method_id}, keyseed {v.keyseed_version}).")
    pdf.rows(
        ["Model", "Name", "Version", "File digest"],
        [
            [m.role + (f" ({m.endpoint})" if m.endpoint else ""), m.name, m.version, m.file_digest]
            for m in v.models
        ],
        [45, 50, 25, 54],
    )
    pdf.para("Vocabulary: " + "; ".join(f"{k} {val}" for k, val in v.vocabulary.items()))
    if v.density:
        pdf.para("Density: " + "; ".join(f"{k} {val}" for k, val in v.density.items()))
    parameters = [[k, _json(val)] for k, val in v.parameters.items()]
    parameters += [[f"prompt: {k}", _json(val)] for k, val in v.prompt.items()]
    if parameters:
        pdf.rows(["Parameter", "Value"], parameters, [60, 114])

    log = r.prompt_log
    pdf.heading("What the LLM saw: the prompt log")
    pdf.para(log.in_words)
    pdf.labelled("Prompts recorded", str(log.prompts))
    pdf.labelled("Head hash", log.head)
    pdf.labelled("Log (JSONL)", log.log)
    pdf.labelled("Hash", log.algorithm)
    pdf.labelled("Verify", log.verify)

    pdf.heading("Sample documents")
    if r.samples is None:
        pdf.para("Released documents are read by the owner organisation and the grantees only.")
    elif not r.samples:
        pdf.para("No document was released.")
    for sample in r.samples or []:
        pdf.para(f"{sample.label} - {', '.join(sample.keyphrases)}", bold=True)
        pdf.para(sample.text)
    return bytes(pdf.output())
