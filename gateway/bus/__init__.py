"""The session bus: lanes, turns, the context window and its compression.

- ``lanes``: ``SessionBus``, one lane per session key, at most one turn per key across instances
  (a lease in the ``lanes`` table); the sweeper picks up what a crash left;
- ``turns``: ``TurnRunner``, one turn on a worker thread: load the window, run the agent loop,
  write the transcript and queue the replies in one transaction;
- ``context``: the transcript rendered for the model; ``compression``: older turns summarised.
"""
