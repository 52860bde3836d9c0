"""The published contracts, generated from the code that defines them.

``python -m interlock.contracts`` writes ``contracts/`` (``--check`` tells when it drifted):
:mod:`interlock.contracts.gen` writes the manifest and run-log JSON Schemas and the
catalogue, :mod:`interlock.contracts.wire` the AsyncAPI document of the NATS wire, from
its channels (:mod:`~interlock.contracts.channels`), messages
(:mod:`~interlock.contracts.messages`) and encoded examples
(:mod:`~interlock.contracts.examples`).
"""
