"""One job at a time off the training loop: the trainer writes a version and its checkpoint here
while the next step trains.

`submit` first waits for the previous job (publications stay in order and at most one step's
copies are held), `join` waits and re-raises the job's error in the trainer's thread, so a failed
publication stops the trainer as it did when it ran inline.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class BackgroundJob:
    def __init__(self, name: str) -> None:
        self.name = name
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, fn: Callable[[], None]) -> None:
        self.join()

        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # handed to the trainer's thread by join()
                self._error = exc

        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
