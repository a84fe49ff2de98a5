"""The tools a gateway offers and who may run them.

- ``catalog``: every tool of this process, toolsets, MCP servers, the workspace;
- ``approvals``: the approval policy and ``/approve``; ``approvals_store``: the ``approvals`` table.
"""
