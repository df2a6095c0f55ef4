"""A verifiers environment with two trained seats (self-play: both are the policy), paired with any taskset by
``env_id`` (``vf-two-seats``). The searcher refuses it: an episode there is one seat's conversation."""

import verifiers.v1 as vf


class TwoSeatsConfig(vf.EnvConfig):
    first: vf.AgentConfig = vf.AgentConfig()
    second: vf.AgentConfig = vf.AgentConfig()


class TwoSeatsEnv(vf.Env[TwoSeatsConfig]):
    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        await agents.first.run(task)
        await agents.second.run(task)


__all__ = ["TwoSeatsEnv"]
