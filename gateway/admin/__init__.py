"""Admin pages (``/admin``): login, sessions and transcripts, users, jobs, approvals, health.

- ``views``: the aiohttp routes and Jinja2 templates (autoescaped); changes go through the chat
  commands' code; ``auth``: signed session cookie and CSRF; ``limits``: login attempt limits;
  ``sessions``: admin login rows; ``queries``: read-only SQL for the pages.
"""
