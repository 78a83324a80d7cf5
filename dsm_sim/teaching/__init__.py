"""The lifecycle, taught: the narrated walk-through, its explorer page and the state diagram.

``dsm demo`` runs the invoice walk-through on a real store and checks every
claim it narrates (:mod:`.demo`, printed by :mod:`.demo_render`, recorded as
an explorer page by :mod:`.demo_page`); ``dsm diagram`` prints the state
diagram generated from the transition table (:mod:`.diagram`).  They use the
engine as a deployment does and live outside it: the engine a team deploys
carries no tutorial, and imports nothing from the harness.
"""
