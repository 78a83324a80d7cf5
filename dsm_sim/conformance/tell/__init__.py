"""How a finding is told and shrunk: programs as data, trimming, the story, the outputs.

This stage takes a violation (its program of calls and its story) and hands
on what a reader gets: the program trimmed to the steps it needs (``trim``,
within Hypothesis' shrink budget, ``shrink_budget``), told as numbered steps
(``story``) and printed once as a Python program that runs as pasted
(:mod:`dsm_sim.conformance.program`, the data every stage shares); a failure Hypothesis could not replay recognised as flaky
(``flaky``); the last confirming replay recorded for the explorer
(``replayed``); a finding through the protocol as a test in the handler's
language (``steps``, which keeps of the kit's reads the one that showed the
failure, ``read_backs``, and names the handler's own tokens, ``grants``;
spelled by ``csharp``, ``node`` and ``java``, chosen by ``languages``); and the whole report as JSON, JUnit XML and HTML (``outputs``).
"""
