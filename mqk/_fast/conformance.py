"""Each pure-Python twin, as a module, satisfies its kernel's Protocol (mqk._fast.api): mypy checks the assignments
below, so a twin whose functions drift from the typed face fails `make lint`. Nothing imports this module at run
time but tests/unit/test_fast_api.py, which also holds the compiled modules to the same faces."""

from __future__ import annotations

from mqk._fast import api, clentry_py, cqunit_py, fetchreq_py, fetchresp_py, producereq_py, produceresp_py, recbatch_py

clentry: api.ClentryApi = clentry_py
cqunit: api.CqunitApi = cqunit_py
fetchreq: api.FetchreqApi = fetchreq_py
fetchresp: api.FetchrespApi = fetchresp_py
producereq: api.ProducereqApi = producereq_py
produceresp: api.ProducerespApi = produceresp_py
recbatch: api.RecbatchApi = recbatch_py
