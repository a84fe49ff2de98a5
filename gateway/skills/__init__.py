"""The gateway side of skills (the skills themselves live in ``agent.skills``).

- ``commands``: ``/skills`` and the plan lines of ``/status``; ``cli``: ``gateway skills ...``
  and ``gateway sessions export``; ``eval_export``, ``sessions_export``: sessions as eval cases.
"""
