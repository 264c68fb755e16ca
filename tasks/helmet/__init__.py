"""Offline HELMET-style suite: importing this package registers its tasks.

Recall is faithful to HELMET/RULER; RAG, re-rank, citation, long-document QA,
summarisation and many-shot ICL are labelled offline analogues built from seeded
generators of fictional material (`Task.fidelity`)."""
from tasks.helmet import recall_niah  # noqa: F401
from tasks.helmet import recall_kv, recall_ruler  # noqa: F401,E402
