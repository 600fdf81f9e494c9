seen = []
class Probe:
    """A pure-ASGI class passed with --middleware (vllm: app.add_middleware(cls))."""
    def __init__(self, app):
        self.app = app
    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            seen.append((scope["type"], scope["path"], hasattr(scope["app"].state, "engine_client")))
        await self.app(scope, receive, send)
