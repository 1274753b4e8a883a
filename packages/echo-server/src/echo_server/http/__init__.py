"""The OpenAI-compatible HTTP API of a node (``echo-sd serve --http-listen``): an adapter over
the transport-free node (:mod:`echo_server.node`: its engine thread, limits and metrics).

``app`` has the routes, ``schemas`` the request bodies, ``translate`` the one mapping to the
node's generation request (the gRPC API's validation) and back to OpenAI's response types,
``errors`` OpenAI's error shape and status codes, ``guard`` authentication and the body limit,
``server`` the uvicorn listener inside the node's event loop.
"""
