"""Agents written with the frameworks users write them with, importable as
`tests.framework_agents:name`: the OpenAI Agents SDK and LangChain's ChatOpenAI, each offering
tests/chat_families.py's two tools and running them, up to three model turns. Each tool call they
ran is kept by the episode's key (`RAN`) for the test to compare with what the model called."""

from __future__ import annotations

from typing import Any

from tests.user_agents import run_tool

RAN: dict[str, list[tuple[str, dict[str, Any]]]] = {}
"""key -> (tool, arguments) of each call the framework ran."""


def _ran(key: str, name: str, arguments: dict[str, Any]) -> str:
    RAN.setdefault(key, []).append((name, arguments))
    return run_tool(name, arguments)


async def agents_sdk(row: dict[str, Any], client: Any) -> float:
    """The OpenAI Agents SDK: an Agent with two function tools, on the chat completions API
    (`OpenAIChatCompletionsModel`: the endpoint serves no Responses API), tracing off (it would
    export to OpenAI)."""
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    key = client.api_key

    @function_tool
    def search(query: str, site: str) -> str:
        """Search one site."""
        return _ran(key, "search", {"query": query, "site": site})

    @function_tool
    def add_days(days: int) -> str:
        """The date so many days from today."""
        return _ran(key, "add_days", {"days": days})

    model = OpenAIChatCompletionsModel(model="policy", openai_client=client)
    agent = Agent(name="helper", tools=[search, add_days], model=model)
    await Runner.run(agent, row["prompt"], max_turns=4)
    return 1.0


async def langchain(row: dict[str, Any], client: Any) -> float:
    """LangChain's ChatOpenAI with two tools bound, the loop written by hand as its docs do."""
    from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    key = client.api_key

    @tool
    def search(query: str, site: str) -> str:
        """Search one site."""
        return _ran(key, "search", {"query": query, "site": site})

    @tool
    def add_days(days: int) -> str:
        """The date so many days from today."""
        return _ran(key, "add_days", {"days": days})

    tools = {"search": search, "add_days": add_days}
    llm = ChatOpenAI(model="policy", base_url=str(client.base_url), api_key=key, max_retries=0)
    bound = llm.bind_tools(list(tools.values()))
    messages: list[BaseMessage] = [HumanMessage(row["prompt"])]
    for _ in range(3):
        reply = await bound.ainvoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            result = tools[call["name"]].invoke(call["args"])
            messages.append(ToolMessage(result, tool_call_id=call["id"]))
    return 1.0
