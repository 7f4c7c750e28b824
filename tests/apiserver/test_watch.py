"""Watch streams: events, bookmarks, selectors, history window and 410 Gone
after a restart with --state; kubectl get -w."""
import http.client
import json
import os
import shutil
import subprocess
import tempfile
import time
import unittest

from standin_fixture import StandIn

CM = "/api/v1/namespaces/default/configmaps"


class WatchStream:
    def __init__(self, s, path):
        self.conn = http.client.HTTPConnection(s.host, s.port, timeout=10)
        self.conn.request("GET", path)
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200, self.resp.status

    def next(self, skip_bookmarks=False):
        while True:
            line = self.resp.readline()
            if not line:
                return None
            ev = json.loads(line)
            if not (skip_bookmarks and ev["type"] == "BOOKMARK"):
                return ev

    def close(self):
        self.conn.close()


def cm(s, name, labels=None):
    code, obj = s.api("POST", CM, {"metadata": {"name": name, "labels": labels or {}}})
    assert code == 201, obj
    return obj


class WatchTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = StandIn("--bookmark-interval", "0.3", "--watch-history", "20")

    @classmethod
    def tearDownClass(cls):
        cls.s.stop()
        shutil.rmtree(cls.s.tmp, ignore_errors=True)

    def test_events_and_bookmarks(self):
        _, lst = self.s.api("GET", CM)
        rv = lst["metadata"]["resourceVersion"]
        w = WatchStream(self.s, CM + "?watch=true&allowWatchBookmarks=true&timeoutSeconds=10"
                        "&resourceVersion=" + rv)
        made = cm(self.s, "wa")
        ev = w.next(skip_bookmarks=True)
        self.assertEqual((ev["type"], ev["object"]["metadata"]["name"]), ("ADDED", "wa"))
        self.s.api("PATCH", CM + "/wa", {"data": {"k": "v"}}, "application/merge-patch+json")
        ev = w.next(skip_bookmarks=True)
        self.assertEqual((ev["type"], ev["object"]["data"]), ("MODIFIED", {"k": "v"}))
        bm = w.next()
        self.assertEqual(bm["type"], "BOOKMARK")
        self.assertGreaterEqual(int(bm["object"]["metadata"]["resourceVersion"]),
                                int(ev["object"]["metadata"]["resourceVersion"]))
        self.s.api("DELETE", CM + "/wa")
        ev = w.next(skip_bookmarks=True)
        self.assertEqual((ev["type"], ev["object"]["metadata"]["uid"]),
                         ("DELETED", made["metadata"]["uid"]))
        w.close()

    def test_selector_watch_sees_objects_leave(self):
        w = WatchStream(self.s, CM + "?watch=true&labelSelector=team%3Dred&timeoutSeconds=10")
        cm(self.s, "sel-red", {"team": "red"})
        cm(self.s, "sel-blue", {"team": "blue"})
        self.assertEqual(w.next()["object"]["metadata"]["name"], "sel-red")
        self.s.api("PATCH", CM + "/sel-red", {"metadata": {"labels": {"team": "blue"}}},
                   "application/merge-patch+json")
        ev = w.next()
        self.assertEqual((ev["type"], ev["object"]["metadata"]["name"]), ("DELETED", "sel-red"))
        w.close()

    def test_too_old_resource_version_is_gone(self):
        first = cm(self.s, "old-0")["metadata"]["resourceVersion"]
        for i in range(1, 25):
            cm(self.s, "old-%d" % i)
        w = WatchStream(self.s, CM + "?watch=true&resourceVersion=" + first)
        ev = w.next()
        self.assertEqual(ev["type"], "ERROR")
        self.assertEqual(ev["object"]["code"], 410)
        w.close()

    def test_timeout_ends_stream(self):
        start = time.monotonic()
        w = WatchStream(self.s, CM + "?watch=true&timeoutSeconds=1")
        while w.next() is not None:
            pass
        w.close()
        self.assertLess(time.monotonic() - start, 5)

    def test_kubectl_get_watch(self):
        proc = subprocess.Popen(
            [self.s.kubectl_bin, "--kubeconfig", self.s.kubeconfig, "--cache-dir",
             os.path.join(self.s.tmp, "kcache"), "get", "cm", "-w", "--request-timeout=20s"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(1.5)
            cm(self.s, "seen-by-kubectl")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                line = proc.stdout.readline()
                if "seen-by-kubectl" in line:
                    break
            else:
                self.fail("kubectl get -w did not print the new object")
        finally:
            proc.kill()
            proc.communicate()


class RestartTest(unittest.TestCase):
    def test_state_survives_and_old_watch_is_gone(self):
        tmp = tempfile.mkdtemp(prefix="standin-state-")
        state = os.path.join(tmp, "state.json")
        s = StandIn(state=state, tmp=tmp)
        try:
            s.kubectl("apply", "-f", os.path.join(os.path.dirname(__file__), "fixtures",
                                                  "widget-crd.yaml"))
            kept = cm(s, "kept")
            old_rv = int(kept["metadata"]["resourceVersion"])
            cm(s, "later")
            s.stop()
            s.start()
            code, obj = s.api("GET", CM + "/kept")
            self.assertEqual((code, obj["metadata"]["uid"]), (200, kept["metadata"]["uid"]))
            # The CRD's resources are served again.
            s.kubectl("get", "widgets")
            newer = cm(s, "newer")
            self.assertGreater(int(newer["metadata"]["resourceVersion"]), old_rv + 1)
            w = WatchStream(s, CM + "?watch=true&resourceVersion=%d" % old_rv)
            ev = w.next()
            self.assertEqual((ev["type"], ev["object"]["code"]), ("ERROR", 410))
            w.close()
            # A watch from the current version works.
            _, lst = s.api("GET", CM)
            w = WatchStream(s, CM + "?watch=true&timeoutSeconds=5&resourceVersion="
                            + lst["metadata"]["resourceVersion"])
            cm(s, "after-restart")
            self.assertEqual(w.next()["object"]["metadata"]["name"], "after-restart")
            w.close()
        finally:
            s.stop()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
