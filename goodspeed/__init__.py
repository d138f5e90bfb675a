"""The `goodspeed` command: above both the engine and the server, so it may import either
while the engine never imports the server."""
