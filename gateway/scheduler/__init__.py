"""Scheduled reports: jobs, their triggers, fires and runs, commands, tool, store and CLI.

- ``triggers``: the only module that imports APScheduler (crontab rules, zones, misfires);
- ``planner``: ``JobPlanner`` validates and stores job definitions; ``service``: ``PushService``
  claims fires across instances and runs them; ``push_run``: one report run as an agent turn;
- ``commands``: ``/jobs``, ``/schedule``...; ``tool``: ``schedule_report``; ``cli``: ``gateway jobs``;
- ``store``: the ``jobs`` and ``job_runs`` tables.
"""
