"""The rollout explorer's query layer, shared by the explorer page, the API, exports, annotation
queues and behaviours: params (the query string), paging (keyset cursors), filters (the registry
other apps add filters to from their AppConfig.ready()), search (one backend per database vendor,
chosen once) and query (a page of rollouts). It renders no HTML: the search snippet is marked up
in the view layer (rollouts templatetags). docs/architecture.md shows how to add a filter or a
search backend.
"""
