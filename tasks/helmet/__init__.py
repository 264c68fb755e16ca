"""Offline HELMET-style suite (its tasks are listed in `tasks/registry.py`).

Recall is faithful to HELMET/RULER; RAG, re-rank, citation, long-document QA,
summarisation and many-shot ICL are labelled offline analogues built from seeded
generators of fictional material (`Task.fidelity`)."""

CATEGORIES = ("recall", "rag", "rerank", "cite", "longqa", "summ", "icl")
