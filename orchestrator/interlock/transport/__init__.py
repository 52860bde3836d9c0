"""The transport: what the orchestrator and the agent workers both stand on.

CloudEvents over NATS (:mod:`.cloudevents`), connecting (:mod:`.connection`), the shared
JetStream context (:mod:`.jetstream`), the wire names (:mod:`.subjects`), streams and
buckets (:mod:`.streamconfigs`, :mod:`.provision`), atomic appends (:mod:`.appends`), pull
readers (:mod:`.pulling`), durable consumers and dead letters (:mod:`.consuming`), the task
protocol both ends of a capability request speak (:mod:`.tasks`), and stopping background
tasks for sure (:mod:`.cancelling`). It imports the core at most, never the runtime or the
SDK.
"""
