"""How an answer is judged: which property a difference between handler and model breaks.

This stage takes the handler's answer, the model's answer for the same call
at the same instant, and the records before and after, and hands on a
:class:`~dsm_sim.conformance.properties.Finding` (the property, and one
sentence an author can act on) or nothing (``judges``).  A library judged
by its own declared semantics is judged through a profile (``semantics``);
what a race leaves undecided in a history row waits for the sweep that
decides it (``doubt``).
"""
