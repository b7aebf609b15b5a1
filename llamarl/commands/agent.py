"""`llamarl agent serve --agent module:function`: an agent server, playing the episodes that runs
with `environment.agent_url` hand it (`llamarl.agents.remote`)."""

from __future__ import annotations

import argparse

from llamarl.commands.base import Subparsers


def register(sub: Subparsers) -> None:
    agent = sub.add_parser("agent", help="agents in processes of their own")
    agent_sub = agent.add_subparsers(dest="agent_command", required=True)
    serve = agent_sub.add_parser("serve", help="play the episodes runs hand over (environment.agent_url)")
    serve.add_argument("--agent", required=True, help="your async agent function, module:function")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8100)
    serve.add_argument("--max-episodes", type=int, default=64, help="episodes played at once; more are refused (429)")
    serve.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from llamarl.agents.agent_server import serve_agents

    serve_agents(args.agent, args.host, args.port, args.max_episodes)
    return 0
