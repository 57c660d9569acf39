"""NVIDIA Xid events judged for ``gpu.errors``: NVIDIA's Xid catalog as afddiag's tables (the Xids whose
resolution is a reset, a reboot or service; those the application causes), the recovery action the driver
prints, and which boot each event is from (an earlier boot's Xid asks for no reset or reboot now). Pure."""

from __future__ import annotations

from typing import Any

from afddiag.textnum import digits
from afddiag.verdict import FAIL, PASS, WARN


def this_boot(events: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The Xid events of the boot running when the log was read (``boots_ago`` 0 or absent: /dev/kmsg
    holds no other); an earlier boot's Xid was before a reboot and asks for no reset or reboot now."""
    return [e for e in events or [] if isinstance(e, dict) and not e.get("boots_ago")]


# the Xids whose resolution is a GPU reset, a reboot or service -> (what it is, action). The action is
# afddiag's closed set (checks/gates.toml [actions]).
XID_FATAL = {48: ("double-bit ECC error", "RESET_GPU"), 61: ("internal micro-controller breakpoint", "RESET_GPU"),
             62: ("internal micro-controller halt", "RESET_GPU"),
             63: ("ECC page retirement or row remapping recording event: takes effect at the next GPU reset",
                  "RESET_GPU"),
             64: ("ECC page retirement or row remapper recording failure", "RESET_GPU"),
             74: ("NVLink error", "RESET_GPU"), 79: ("GPU has fallen off the bus", "REBOOT"),
             95: ("uncontained ECC error", "RESET_GPU"), 110: ("security fault error", "RESET_GPU"),
             119: ("GSP RPC timeout", "RESET_GPU"), 120: ("GSP error", "RESET_GPU"),
             121: ("C2C link corrected error", "RESET_GPU"), 136: ("link training failed", "RESET_GPU"),
             140: ("unrecovered ECC error", "RESET_GPU"), 143: ("GPU initialization failure", "RESET_GPU")}
# Xids the catalog attributes to the application (resolution: restart the application) or that only
# warn (contained errors, rates): WARN, the GPU stays in service.
XID_APP = {8: "GPU stopped processing (channel idle timeout)", 13: "graphics engine exception (often a kernel's "
           "out-of-range access)", 31: "GPU memory page fault (often an application's illegal address)",
           32: "invalid or corrupted push buffer stream", 38: "driver firmware error", 43: "GPU stopped "
           "processing (the application's channel was reset)", 45: "preemptive cleanup after a previous error",
           68: "video decoder exception", 69: "graphics engine class error", 92: "high single-bit ECC error rate",
           94: "contained ECC error (restart the application; reset the GPU when convenient)",
           109: "context switch timeout", 137: "NVLink FLA privilege error", 144: "NVLink error", 145: "NVLink error",
           146: "NVLink error", 147: "NVLink error", 148: "NVLink error", 149: "NVLink error", 150: "NVLink error"}
# Xid 154 (and newer drivers on any Xid) print the recovery action the GPU needs; nvmlGpuRecoveryAction_t.
RECOVERY_ACTIONS = (("node reboot required", "REBOOT"), ("system reboot", "REBOOT"), ("drain and reset", "RESET_GPU"),
                    ("gpu reset required", "RESET_GPU"), ("bus reset", "RESET_GPU"), ("drain p2p", "WARN"),
                    ("(none)", "NONE"))
ACTION_RANK = {"HW_INSPECTION": 4, "REBOOT": 3, "RESET_GPU": 2}
REMAP_FAILED_REMEDY = ("drain the host and have the GPU serviced (RMA): row remapping failed, no spare rows are "
                       "left in "
                       "that bank (NVIDIA's GPU memory error management guide: the failure flag is the RMA threshold); "
                       "a reset or reboot does not restore spare rows")
XID_UNKNOWN = "not in afddiag's Xid table"


def xid_judgment(ev: dict) -> tuple[str, str, str]:
    """One Xid event ``{xid, pci, text}`` → ``(verdict, words, action)`` by the recovery action the
    driver printed (Xid 154 "GPU recovery action changed ... to 0x1 (GPU Reset Required)"), else by
    NVIDIA's Xid catalog: reset/reboot → FAIL with RESET_GPU/REBOOT; application-caused → WARN;
    an Xid not in the catalog → WARN quoting the line."""
    xid = ev.get("xid")
    if isinstance(xid, str) and digits(xid.strip()):  # a hand-written snapshot may quote it
        xid = int(xid)
    text = str(ev.get("text") or ev.get("message") or ev.get("line") or "")
    where = ev.get("pci") or "a GPU"
    low = text.lower()
    # the action the GPU is in now: the last "to ..." of a "changed from X to Y" line
    tail = low.rsplit(" to ", 1)[-1] if "recovery action" in low else low
    for words, action in RECOVERY_ACTIONS:
        if words in tail and ("recovery action" in low or words != "(none)"):
            if action == "NONE":
                return PASS, f"Xid {xid} on {where}: recovery action back to none", "NONE"
            if action == "WARN":
                return WARN, f"Xid {xid} on {where}: {text}", "NONE"
            return FAIL, f"Xid {xid} on {where}: {text}", action
    if xid in XID_FATAL:
        what, action = XID_FATAL[xid]
        return FAIL, f"Xid {xid} ({what}) on {where}", action
    if xid in XID_APP:
        return WARN, f"Xid {xid} ({XID_APP[xid]}) on {where}", "NONE"
    return WARN, f"Xid {xid} ({XID_UNKNOWN}) on {where}: \"{text}\"", "NONE"


EARLIER_BOOT = "in an earlier boot"
EARLIER_BOOT_REMEDY = ("nothing to do for this boot: the reboot since has reset the GPU; a fatal Xid from this boot "
                       "would fail this gate (a repeat of the same Xid after the reboot means service, RMA)")


def _boots_ago(ev: dict[str, Any]) -> str:
    n = ev.get("boots_ago")
    return f"({EARLIER_BOOT}, {n} reboot(s) ago: not this boot's fault)"


def judge_xids(events: list[dict[str, Any]] | None, fails: list[str], warns: list[str],
                xid_actions: list[str]) -> tuple[list[str], bool, int]:
    """gpu.errors' Xid part: each of this boot's Xids judged (:func:`xid_judgment`) into ``fails``/``warns``
    and its action into ``xid_actions`` (of a GPU's Xid 154s, only the last: the recovery action now); a
    fatal Xid of an earlier boot is history, a WARN. Returns ``(the actions the driver printed in a recovery
    action line, whether an Xid was unknown, how many Xids were from earlier boots)``."""
    driver_said: list[str] = []  # REBOOT/RESET_GPU the driver printed (a recovery action line), not inferred
    unknown_xid = False
    last_154: dict = {}
    now = this_boot(events)
    for ev in now:
        if ev.get("xid") == 154:
            last_154[ev.get("pci")] = ev
    earlier = [ev for ev in events or [] if isinstance(ev, dict) and ev.get("boots_ago")]
    # before a reboot: history, never a reset or reboot for this boot
    warns.extend(f"{xid_judgment(ev)[1]} {_boots_ago(ev)}" for ev in earlier if xid_judgment(ev)[0] == FAIL)
    for ev in now:
        if ev.get("xid") == 154 and last_154.get(ev.get("pci")) is not ev:
            continue
        verdict, what, action = xid_judgment(ev)
        if verdict == FAIL:
            fails.append(what)
            xid_actions.append(action)
            if "recovery action" in str(ev.get("text") or ev.get("message") or ev.get("line") or "").lower():
                driver_said.append(action)
        elif verdict == WARN:
            warns.append(what)
            unknown_xid |= XID_UNKNOWN in what
    return driver_said, unknown_xid, len(earlier)
