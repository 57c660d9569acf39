"""afddiag: bring-up diagnostics for an attention-FFN-disaggregated inference fleet.

Pipeline: probes read the host into plain facts (:mod:`afddiag.model`), gates judge facts into
verdicts (:mod:`afddiag.gates`), reports render verdicts (:mod:`afddiag.report`).
"""

__version__ = "0.1.0"
