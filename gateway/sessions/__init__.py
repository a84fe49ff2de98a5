"""Who is talking and which conversation: users, identities, links, sessions, resets.

- ``directory``: users, identities, ``/link`` codes, pairing, session lists;
- ``commands``: the session commands (``/new``, ``/status``, ``/sessions``, ``/resume``, ...);
- ``resets``: idle and daily resets; ``conversations``: the transcript read for the web chat.
"""
