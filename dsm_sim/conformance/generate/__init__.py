"""What a test case is made of: its world, the values its steps carry, and the fixed programs.

This stage takes nothing but the contract's documented domain and hands on
data: a :class:`~dsm_sim.conformance.generate.worlds.World` (items, node
options, time zone, apps, where the clock starts), the strategies the
search's rules draw from (``draws``, ``domains``, ``payloads``), the named
arguments steps take (``steps``: which race, where the clock stands, which
start state), and the edge probes as programs of calls (``probes``).  It
imports nothing from the stages after it: generating never touches a handler.
"""
