"""The gateway's HTTP surface as routers, one per concern; `gateway.app.create_app` mounts them."""
