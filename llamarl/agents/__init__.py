"""Agents as their authors write them (`environment.kind: agent`): an async function that talks
to the model through an OpenAI-compatible endpoint on the generator, each episode under its own
key, every request recorded as the token ids the model was given and sampled.

`runner` plays a batch of episodes; `endpoint` and `server` are the HTTP side; `record` keeps an
episode's tokens; `messages`, `wire` and `responses` are the OpenAI forms; `play` runs the
agent function; `openenv` drives an OpenEnv environment as an agent."""
