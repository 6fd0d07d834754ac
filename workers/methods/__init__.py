"""Synthetic-data methods: one package per method, one entry point each.

A method reads a labelled private corpus once and returns its DP outputs together with
the :class:`~workers.privacy.events.PrivacyEvent` of every release it made, so that the
service charges every method through the same ledger. What methods share (noise,
accounting, embeddings, the LLM client, checkpoints) lives outside the method packages.

* :mod:`workers.methods.aug_pe` — Private Evolution for text (Aug-PE, Xie et al. 2024).
* :mod:`workers.methods.checkpoints` — where a method keeps the DP outputs of a run so a
  crashed run resumes without spending again.
"""
