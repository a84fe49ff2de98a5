"""A tiny stdio MCP server for the tests (plain JSON-RPC over stdin/stdout, no SDK): ``add(a, b)``,
``shout(text)`` (read-only), and for the failure tests ``pid()`` (its process id), ``crash()``
(the process exits without answering) and ``hang()`` (never answers). With ``MCP_TEST_STDERR`` set
it prints that value on stderr when it starts."""

from __future__ import annotations

import json
import os
import sys
import time

TOOLS = [
    {"name": "add", "description": "Add two integers.",
     "inputSchema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                     "required": ["a", "b"]}},
    {"name": "shout", "description": "Upper-case a text.", "annotations": {"readOnlyHint": True},
     "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
    {"name": "pid", "description": "The server's process id.", "annotations": {"readOnlyHint": True},
     "inputSchema": {"type": "object", "properties": {}}},
    {"name": "crash", "description": "Exit at once, without answering.", "inputSchema": {"type": "object"}},
    {"name": "hang", "description": "Never answer.", "inputSchema": {"type": "object"}},
]


def answer(request: dict) -> dict | None:
    method, params = request.get("method"), request.get("params") or {}
    if "id" not in request:
        return None  # a notification
    if method == "initialize":
        result = {"protocolVersion": params.get("protocolVersion", "2025-06-18"), "capabilities": {"tools": {}},
                  "serverInfo": {"name": "test-server", "version": "1.0"}}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        args = params.get("arguments") or {}
        if params.get("name") == "add":
            text = str(int(args["a"]) + int(args["b"]))
        elif params.get("name") == "shout":
            text = str(args["text"]).upper()
        elif params.get("name") == "pid":
            text = str(os.getpid())
        elif params.get("name") == "crash":
            os._exit(3)
        elif params.get("name") == "hang":
            while True:  # deaf to everything, its closed stdin included: only a signal ends it
                time.sleep(60)
        else:
            return {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32602, "message": "unknown tool"}}
        result = {"content": [{"type": "text", "text": text}], "isError": False}
    elif method == "ping":
        result = {}
    else:
        return {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32601, "message": f"no {method}"}}
    return {"jsonrpc": "2.0", "id": request["id"], "result": result}


def main() -> None:
    if os.environ.get("MCP_TEST_STDERR"):  # a chatty server: prints what it was given on stderr
        print(f"starting with {os.environ['MCP_TEST_STDERR']}", file=sys.stderr, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        response = answer(json.loads(line))
        if response is not None:
            sys.stdout.write(json.dumps(response) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
