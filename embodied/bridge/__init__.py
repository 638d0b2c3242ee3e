"""The robot bridge: a policy server, a client with the ``Policy`` interface, a safe control
loop and robot drivers.

The robot side (``wire``, ``client``, ``safety``, ``loop``, ``drivers``, ``latency``, ``fleet``) imports
only ``embodied.core``, numpy, msgpack and websockets, so it runs on a robot computer
without torch, MuJoCo or the policies; ``tests/test_bridge.py`` checks this in a process
where importing those fails. ``server`` (with ``batching``: many clients' requests in one
forward pass) needs only the ``Policy`` contract; loading a checkpoint to serve is
``embodied serve``'s job.
"""
