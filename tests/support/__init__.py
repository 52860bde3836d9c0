"""What the tests share: one module per area (``support.runtime`` starts NATS stacks and
runs the CLI, ``support.gateway`` a gateway over them, ...). ``tests/`` is on the import
path (pytest puts the folder of the top conftest.py there), so any test imports
``from support.<area> import ...``."""
