"""Agents as their authors write them (`environment.kind: agent`): an async function that talks
to the model through an OpenAI-compatible endpoint on the generator, each episode under its own
key, every request recorded as the token ids the model was given and sampled.

`runner` plays a batch of episodes; `endpoint` and `server` are the HTTP side; `record` keeps an
episode's tokens; `messages`, `wire` and `responses` are the OpenAI forms; `limits` is what a
request may ask of the model; `play` runs the agent function; `demonstrations` writes an agent's
warm start; `openenv` drives an OpenEnv environment as an agent."""
