"""The ranks' c10d store, with every value signed by the launch.

torch's TCPStore has no authentication: any process on the host (on any host
that can reach the port, since torchrun's store listens on every interface)
can connect to it, list its keys, read them and write them.  The ranks meet
through it: gloo's ranks publish their addresses there (``default_pg/<group>//
cpu//0/<rank>``) when a group forms, at start-up and at every ``new_group``.
A foreign value there is read as an address (we saw ``ValueError:
basic_string::_M_create`` from gloo for random bytes), or, well formed, could
point a rank at someone else's listener.

``SignedStore`` wraps the store the ranks use: each value is written with an
HMAC-SHA256 tag over (key, value) under the launch's secret, which lives only in
the launch's private folder (``jobdir.STORE_SECRET``), and each value read is
checked; a value without the right tag raises ``StoreTampered``, which says
what happened.  So a foreign writer makes the launch fail with that message,
never go on with its data.

It wraps the store torchrun shares with its ranks (torch's default; with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` the ranks fall back to plain, unsigned
``env://``, see ``worker._signed_store``).

What it does not cover: counters (``add``, used for barriers) cannot carry a
tag, and a foreign process can still delete keys or read them, so it can make
a launch wait until its timeout; and gloo's connections themselves are not
authenticated.  ``docs/launcher.md`` ("On a shared host") says what closes
those: a network namespace per user.
"""
from __future__ import annotations

import hashlib
import hmac

import torch.distributed as dist

_TAG = hashlib.sha256().digest_size


class StoreTampered(RuntimeError):
    """A value in the launch's c10d store was not written by this launch's ranks."""


def _bytes(value) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class SignedStore(dist.Store):
    def __init__(self, inner: dist.Store, secret: bytes, where: str):
        super().__init__()
        self.inner, self._secret, self.where = inner, secret, where

    def _tag(self, key: str, value: bytes) -> bytes:
        return hmac.new(self._secret, key.encode() + b"\0" + value, hashlib.sha256).digest()

    def _signed(self, key: str, value) -> bytes:
        value = _bytes(value)
        return self._tag(key, value) + value

    def _checked(self, key: str, data) -> bytes:
        data = _bytes(data)
        value = data[_TAG:]
        if len(data) < _TAG or not hmac.compare_digest(data[:_TAG], self._tag(key, value)):
            raise StoreTampered(
                f"the value of {key!r} in this launch's c10d store ({self.where}) was not written by "
                "this launch's ranks: another process on this host connected to the store and wrote "
                "it (torch's store accepts anyone who can reach its port). The launch was stopped "
                "rather than use it. Run the cell again; if it happens again, tell the course staff "
                "(see 'On a shared host' in parlab's docs/launcher.md).")
        return value

    # ---------------------------------------------------------------- signed values
    def set(self, key, value):
        self.inner.set(key, self._signed(key, value))

    def get(self, key):
        return self._checked(key, self.inner.get(key))

    def compare_set(self, key, expected, desired):
        expected = _bytes(expected)
        if self.inner.check([key]):
            stored = _bytes(self.inner.get(key))
            current = self._checked(key, stored)
            if current != expected:
                return current
        elif expected:
            return expected  # TCPStore's answer for a missing key and a non-empty expectation
        else:
            stored = b""
        return self._checked(key, self.inner.compare_set(key, stored, self._signed(key, desired)))

    def clone(self):
        return SignedStore(self.inner.clone(), self._secret, self.where)

    # ---------------------------------------------------------------- passed through
    def add(self, key, amount):
        return self.inner.add(key, amount)

    def check(self, keys):
        return self.inner.check(keys)

    def wait(self, keys, timeout=None):
        return self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

    def delete_key(self, key):
        return self.inner.delete_key(key)

    def num_keys(self):
        return self.inner.num_keys()

    def set_timeout(self, timeout):
        return self.inner.set_timeout(timeout)
