"""Synthetic-data methods: one package per method, one entry point each.

A method reads a labelled private corpus once and returns its DP outputs together with
the :class:`~workers.privacy.events.PrivacyEvent` of every release it made, so that the
service charges every method through the same ledger. What methods share (noise,
accounting, embeddings, the LLM client, checkpoints) lives outside the method packages.

* :mod:`workers.methods.aug_pe` — Private Evolution for text (Aug-PE, Xie et al. 2024);
  :mod:`workers.methods.pate_tutor` and :mod:`workers.methods.dp_eda` beside it.
* :mod:`workers.methods.skeleton` — the shape every LLM method's run shares (inputs,
  plan, checkpoint claim, costs, stages, manifest); :mod:`workers.methods.common` what
  their parameters and results share.
* :mod:`workers.methods.checkpoints` — where a method keeps the DP outputs of a run so a
  crashed run resumes without spending again.

:func:`lazy_exports` is how a package imports its names when first used;
:func:`method_exports`, how a method package laid out as the LLM methods are does.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any


def lazy_exports(package: str, **modules: Sequence[str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` (PEP 562) of ``package`` that imports each name of
    ``modules`` (its submodule: the names) when first used, and keeps it in the package;
    so that importing a method's ``params`` to validate a job spec loads no numerical
    library."""
    where = {name: f"{package}.{module}" for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


def method_exports(package: str, prefix: str) -> Callable[[str], Any]:
    """:func:`lazy_exports` for a method package laid out as every LLM method's is:
    ``<prefix>Params`` in its ``params``, ``plan_<name>`` in its ``accounting``,
    ``<prefix>Result`` and ``run_<name>`` in its ``runner`` (``<name>``: the package's
    own, ``aug_pe``)."""
    name = package.rpartition(".")[2]
    return lazy_exports(
        package,
        accounting=[f"plan_{name}"],
        params=[f"{prefix}Params"],
        runner=[f"{prefix}Result", f"run_{name}"],
    )
