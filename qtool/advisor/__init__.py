"""The precision advisor (`qtool advise`, docs/advisor.md): the precision-speculation estimator
and P_zero predictions, a grid-aware prediction, the int8/int16 decision and the least-flash
search."""

from qtool.advisor.advise import THRESHOLD_DB, Advice, advise

__all__ = ["THRESHOLD_DB", "Advice", "advise"]
