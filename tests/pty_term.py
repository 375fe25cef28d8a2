"""A program under a pseudo-terminal for tests: keys in, the screen's text out (escape sequences removed).

The child gets the pty as its controlling terminal (its own session), so Ctrl-C (\\x03) is a SIGINT when
the terminal is in cooked mode and a key when the program reads it raw, as at a real terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import termios
import threading
import time

_ANSI = re.compile(rb"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78]")
PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"
CTRL_C, CTRL_D, ENTER = "\x03", "\x04", "\r"


def _controlling_tty() -> None:
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    def __init__(self, argv: list[str], cwd, env: dict[str, str], rows: int = 30, cols: int = 120) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env,
                                     preexec_fn=_controlling_tty, close_fds=True)
        os.close(slave)
        self.master = master
        self._raw = bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: the child closed its side
                return
            if not chunk:
                return
            with self._lock:
                self._raw += chunk

    def send(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def type(self, text: str, pause: float = 0.005) -> None:
        """Key by key, as a person types (a burst would look like a paste to nobody, but keeps it honest)."""
        for key in text:
            self.send(key)
            time.sleep(pause)

    def paste(self, text: str) -> None:
        self.send(PASTE_START + text + PASTE_END)

    def text(self) -> str:
        with self._lock:
            raw = bytes(self._raw)
        return _ANSI.sub(b"", raw).replace(b"\r", b"").decode("utf-8", "replace")

    def mark(self) -> int:
        return len(self.text())

    def expect(self, pattern: str, after: int = 0, timeout: float = 15.0) -> int:
        """Wait until ``pattern`` (a regex) shows after position ``after``; the position past it."""
        compiled = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = compiled.search(self.text(), after)
            if found:
                return found.end()
            if self.proc.poll() is not None:
                time.sleep(0.1)  # the last output may still be on its way
                found = compiled.search(self.text(), after)
                if found:
                    return found.end()
                raise AssertionError(f"exited {self.proc.returncode} before {pattern!r} showed:\n{self.text()[-3000:]}")
            time.sleep(0.02)
        raise AssertionError(f"{pattern!r} did not show within {timeout}s:\n{self.text()[-3000:]}")

    def wait(self, timeout: float = 10.0) -> int:
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        os.close(self.master)
        self._reader.join(5)
