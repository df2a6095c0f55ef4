"""A verifiers (0.4.0, ``verifiers.v1``) environment with a loop of its own, for the tests: the agent adds two
numbers, then the environment asks follow-ups (``;+7=``: add 7 to the running sum), and each right answer is
worth its share of the reward. Loaded by name (``vf-followup``) from this directory on ``sys.path``, as
verifiers loads any installed taskset with its ``Env``."""

import asyncio
import random

import verifiers.v1 as vf


class FollowUpData(vf.TaskData):
    answer: str
    addends: list[int]  # each follow-up's addend, in order


class FollowUpTask(vf.Task[FollowUpData]):
    @vf.reward(weight=1.0)
    async def running_sums(self, trace: vf.Trace) -> float:
        """The share of the expected answers (the sum, then each follow-up's running sum) given in turn."""
        expected = [int(self.data.answer)]
        for addend in self.data.addends:
            expected.append(expected[-1] + addend)
        replies = [(m.content or "").strip() for m in trace.assistant_messages]
        return sum(r == str(e) for r, e in zip(replies, expected, strict=False)) / len(expected)


class FollowUpConfig(vf.TasksetConfig):
    rows: int = 100
    follow_ups: int = 1
    seed: int = 0


class FollowUpTaskset(vf.Taskset[FollowUpTask, FollowUpConfig]):
    def load(self):
        rng = random.Random(self.config.seed)
        for i in range(self.config.rows):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            addends = [rng.randint(1, 9) for _ in range(self.config.follow_ups)]
            data = FollowUpData(name=f"followup-{i}", prompt=f"{a}+{b}=", answer=str(a + b), addends=addends)
            yield FollowUpTask(data, self.config.task)


class FollowUpEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()
    fail_at: int = 0  # raise after this many answers (0: never), as a broken environment does
    stall_at: int = 0  # wait forever after this many answers (0: never), as an environment that hangs does
    speaks_first: bool = False  # the environment opens the conversation itself, on a prompt-less copy of the task


class FollowUpEnv(vf.Env[FollowUpEnvConfig]):
    """The agent answers the row's prompt, then one follow-up per addend, until the exchange ends."""

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        if self.config.speaks_first:
            async with agents.agent.interaction(task.with_data(prompt=None)) as chat:
                await chat.turn(task.data.prompt)
            return
        async with agents.agent.interaction(task) as chat:
            segment = await chat.turn()
            for answered, addend in enumerate(task.data.addends, 1):
                if segment.terminated:
                    break
                if answered == self.config.fail_at:
                    raise RuntimeError("the follow-up service broke")
                if answered == self.config.stall_at:
                    await asyncio.Event().wait()
                segment = await chat.turn(f";+{addend}=")


__all__ = ["FollowUpEnv", "FollowUpTaskset"]
