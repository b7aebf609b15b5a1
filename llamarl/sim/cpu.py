"""Processor sharing: the busy processes of a layout share the machine's cores.

A task is work in seconds: how long the process would take alone on the machine at its thread
count. While the busy processes want no more threads than there are cores, each runs at full
speed; beyond that, each runs at cores / threads wanted, slowed further by the measured cost
of oversubscription (switching, caches). When another process is busy at the same
time, a role's speed is also divided by its co-run slowdown (memory bandwidth and caches shared
with the other cores), measured by the profile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

EPSILON_S = 1e-12


@dataclass
class Task:
    process: str
    role: str
    threads: int
    remaining_s: float
    done: Callable[[], None]


@dataclass
class Cpu:
    cores: int
    corun_slowdown: dict[str, float]
    """Per role: time alongside other busy processes / time alone (>= 1)."""
    oversubscribed_slowdown: float = 1.0
    """Beyond a fair share when more threads are busy than there are cores (>= 1)."""
    now: float = 0.0
    tasks: dict[str, Task] = field(default_factory=dict)
    busy_s: dict[str, float] = field(default_factory=dict)
    """Seconds each process has spent with a task (its busy time)."""

    def start(self, process: str, role: str, threads: int, work_s: float, done: Callable[[], None]) -> None:
        if process in self.tasks:
            raise RuntimeError(f"{process} is already busy")
        self.tasks[process] = Task(process, role, threads, max(work_s, 0.0), done)

    def busy(self, process: str) -> bool:
        return process in self.tasks

    def speed(self, task: Task) -> float:
        wanted = sum(t.threads for t in self.tasks.values())
        share = 1.0 if wanted <= self.cores else self.cores / wanted / self.oversubscribed_slowdown
        if len(self.tasks) > 1:
            share /= self.corun_slowdown.get(task.role, 1.0)
        return share

    def advance(self) -> bool:
        """Run to the next task completion and fire its callback (which may start others);
        False when nothing is busy."""
        if not self.tasks:
            return False
        speeds = {name: self.speed(task) for name, task in self.tasks.items()}
        step = min(task.remaining_s / speeds[name] for name, task in self.tasks.items())
        self.now += step
        finished = []
        for name, task in self.tasks.items():
            task.remaining_s -= step * speeds[name]
            self.busy_s[name] = self.busy_s.get(name, 0.0) + step
            if task.remaining_s <= EPSILON_S:
                finished.append(task)
        for task in finished:
            del self.tasks[task.process]
        for task in finished:
            task.done()
        return True
