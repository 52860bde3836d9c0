"""The run log's record types, one module per family (:mod:`.run`, :mod:`.actions`,
:mod:`.states`, :mod:`.flow`, over what they share in :mod:`.base`).

Import them from :mod:`interlock.core.events`, which gathers them into one union, the
codec and the schema catalogue.
"""
