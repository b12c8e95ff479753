"""The kubelet's device-plugin directory, watched: kubelet.sock created again (a kubelet
restart, which deletes every socket there) re-registers every resource; one of our
sockets deleted or replaced serves that resource again."""

from __future__ import annotations

from collections.abc import AsyncIterator

from gpuslice.frontends.deviceplugin.manager import PluginManager

KUBELET_SOCKET = "kubelet.sock"


async def follow_kubelet(events: AsyncIterator[tuple[str, str]], manager: PluginManager) -> None:
    """Feed the directory's events to `manager` until they end or this is cancelled."""
    async for name, kind in events:
        if name == KUBELET_SOCKET and kind == "created":
            await manager.kubelet_restarted()
        else:  # deleted, or replaced (a file renamed over it)
            # Its supervisor tells a lost or replaced socket from a file of ours: a
            # restart stops the old server (removing its socket) first.
            for res, handler in manager.handlers.items():
                if handler.resource.socket_name == name:
                    await manager.socket_deleted(res)
