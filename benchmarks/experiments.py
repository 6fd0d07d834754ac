"""DP-KPS's research levers as named experiments: the studies' settings, out of the product.

The product's parameters are :class:`~workers.methods.dpkps.params.DPKPSParams` (the job
spec and the command line); the engine keeps more levers, at the defaults the studies
chose (:data:`~workers.methods.dpkps.params.RESEARCH_FIELDS`, docs/parameters.md). A
benchmark varies them here, by name: each experiment is a set of
:class:`~workers.methods.dpkps.config.GenerationConfig` overrides and the study (a note
under ``benchmarks/notes/``) that measured it. :func:`configure` applies one to a base
configuration; ``bench_low_epsilon --set NAME`` and ``paired set:NAME`` take a name
where they take ``key=value`` settings.

>>> from workers.methods.dpkps.config import GenerationConfig
>>> base = GenerationConfig(epsilon_vocab=1.0, epsilon_kde=5.0)
>>> configure(base, "noise-floor-1").noise_floor
1.0
>>> sorted(overrides("cells-share-0.15"))
['cell_share']
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Final

from workers.methods.dpkps.config import GenerationConfig

ABLATION_NOTE = "2026-11-23-ag-ablation-why-the-defaults.md"
TUNE_NOTE = "2026-11-24-ag-tune-how-the-defaults-were-chosen.md"


@dataclass(frozen=True)
class Experiment:
    """One setting a study measured: what it changes, and where the measurement is."""

    title: str
    overrides: dict[str, Any] = field(default_factory=dict)
    note: str = ""  # the study, a file under benchmarks/notes/


EXPERIMENTS: Final[dict[str, Experiment]] = {
    e_name: e
    for e_name, e in (
        # The first ablation (bench_utility, AG News, ε = 1 + 5, per-mechanism Laplace).
        (
            "iterative",
            Experiment(
                "mode = iterative (log ensemble, random features)",
                {"mode": "iterative"},
                ABLATION_NOTE,
            ),
        ),
        (
            "random-features",
            Experiment(
                "random features, τ = 0.3", {"kde_method": "random_features"}, ABLATION_NOTE
            ),
        ),
        (
            "random-features-256",
            Experiment(
                "random features, τ = 0.3, I = 256",
                {"kde_method": "random_features", "num_features": 256},
                ABLATION_NOTE,
            ),
        ),
        (
            "random-features-unclipped",
            Experiment(
                "random features, τ = 0.3, c = √2 (no clipping)",
                {"kde_method": "random_features", "contribution_bound": 2**0.5},
                ABLATION_NOTE,
            ),
        ),
        ("bandwidth-0.5", Experiment("σ = 0.5", {"bandwidth": 0.5}, ABLATION_NOTE)),
        ("bandwidth-0.2", Experiment("σ = 0.2", {"bandwidth": 0.2}, ABLATION_NOTE)),
        ("temperature-1", Experiment("τ = 1.0", {"temperature": 1.0}, ABLATION_NOTE)),
        ("temperature-0.5", Experiment("τ = 0.5", {"temperature": 0.5}, ABLATION_NOTE)),
        ("temperature-0.3", Experiment("τ = 0.3", {"temperature": 0.3}, ABLATION_NOTE)),
        (
            "noise-floor-1",
            Experiment("noise floor 1 standard deviation", {"noise_floor": 1.0}, ABLATION_NOTE),
        ),
        (
            "class-contrast-0",
            Experiment("class contrast β = 0 (off)", {"class_contrast": 0.0}, ABLATION_NOTE),
        ),
        (
            "class-contrast-2",
            Experiment("class contrast β = 2", {"class_contrast": 2.0}, ABLATION_NOTE),
        ),
        ("phrases-32", Experiment("M = 32", {"max_phrases_per_document": 32}, ABLATION_NOTE)),
        ("vocabulary-300", Experiment("N = 300", {"vocabulary_size": 300}, ABLATION_NOTE)),
        # The small-ε tuning (Gaussian budgets): the values no default chooses.
        (
            "threshold-vocabulary",
            Experiment(
                "thresholded Ṽ, exact kernel",
                {"kde_method": "exact", "vocabulary_method": "threshold"},
                TUNE_NOTE,
            ),
        ),
        (
            "l2-weights",
            Experiment(
                "exact kernel, L2 document weights",
                {"kde_method": "exact", "kde_weighting": "l2"},
                TUNE_NOTE,
            ),
        ),
        ("moments", Experiment("first two moments, τ = 2", {"kde_method": "moments"}, TUNE_NOTE)),
        # The class centroids' levers, each at the setting its study measured.
        (
            "no-label-prior",
            Experiment(
                "label names' prior off", {"label_prior": 0.0}, "2026-11-28-label-names-prior.md"
            ),
        ),
        (
            "cells-kappa-2",
            Experiment("cells with κ = 2", {"cell_kappa": 2.0}, "2026-11-28-cells.md"),
        ),
        (
            "cells-share-0.15",
            Experiment(
                "cells, class sum's share 0.15", {"cell_share": 0.15}, "2026-11-28-cells.md"
            ),
        ),
    )
}


def overrides(name: str) -> dict[str, Any]:
    """The :class:`GenerationConfig` settings of experiment ``name`` (a copy)."""
    try:
        return dict(EXPERIMENTS[name].overrides)
    except KeyError:
        raise ValueError(f"unknown experiment {name!r}; see benchmarks/experiments.py") from None


def configure(base: GenerationConfig, name: str) -> GenerationConfig:
    """``base`` with experiment ``name``'s settings, validated."""
    return replace(base, **overrides(name)).validate()
