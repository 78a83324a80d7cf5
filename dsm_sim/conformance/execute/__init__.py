"""How a test case runs against the handler: the state machine, its steps, and the loop under it.

This stage takes a handler factory and the generated worlds and steps, and
runs them: every step calls the handler and the reference model at the same
instant and hands both answers to the judges (``machine`` and the rules it is
built from; ``pairs`` for the race matrix's cells; ``deployments`` for a
world that changes).  Under it, ``loop`` drives the handler's coroutines,
``scheduler`` chooses the interleaving of racing calls, ``instances`` gives
each worker its own instance on one store, and ``recording`` keeps every
step as data.  It hands on a violation that carries its story and its
program.
"""
