"""Offline HELMET-style suite: importing this package registers its tasks.

Recall is faithful to HELMET/RULER; RAG, re-rank, citation, long-document QA,
summarisation and many-shot ICL are labelled offline analogues built from seeded
generators of fictional material (`Task.fidelity`)."""
from tasks.helmet import (  # noqa: F401
    cite, icl, longqa, rag, recall_kv, recall_niah, recall_ruler, rerank, summ,
)

CATEGORIES = ("recall", "rag", "rerank", "cite", "longqa", "summ", "icl")
