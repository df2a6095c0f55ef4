"""A verifiers (0.4.0, ``verifiers.v1``) taskset for the tests: two-digit additions in the tiny model's
format, rewarded by an exact match. Loaded by name (``vf-sums``) from this directory on ``sys.path``, as
verifiers loads any installed taskset."""

import random

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def exact_match(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)


class SumConfig(vf.TasksetConfig):
    rows: int = 400
    seed: int = 0
    system: str | None = None


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self):
        rng = random.Random(self.config.seed)
        for i in range(self.config.rows):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            yield SumTask(
                SumData(name=f"sum-{i}", prompt=f"{a}+{b}=", answer=str(a + b), system_prompt=self.config.system),
                self.config.task,
            )


__all__ = ["SumTaskset"]
