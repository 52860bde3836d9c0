"""The agent worker SDK: implement capabilities as async handlers, served over JetStream.

```python
from interlock.sdk import Worker, TaskContext, Emit, AgentError

worker = Worker("review-agent", concurrency=4)

@worker.capability("summarize")
async def summarize(inp: dict, ctx: TaskContext) -> dict:
    return {"summary": inp["text"][:100]}

await worker.run("nats://127.0.0.1:4222")
```

Everything public is importable from here; the submodules are implementation details.
"""

from interlock.sdk.context import TASK_COMPLETED, TASK_FAILED, Emit, TaskContext
from interlock.sdk.errors import AgentError, ErrorClass, RetryableError
from interlock.sdk.observe import Outcome, WorkerObserver
from interlock.sdk.worker import Worker

__all__ = [
    "TASK_COMPLETED",
    "TASK_FAILED",
    "AgentError",
    "Emit",
    "ErrorClass",
    "Outcome",
    "RetryableError",
    "TaskContext",
    "Worker",
    "WorkerObserver",
]
