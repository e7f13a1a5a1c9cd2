"""Running a function in a fresh thread (fresh thread-local state, e.g. DirectFile's staging buffer)."""
import threading


def in_new_thread(fn):
    """Run `fn` in a fresh thread (a fresh staging buffer, of the size patched in) and return its result."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # re-raised in the test's thread
            out["error"] = e
    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]
