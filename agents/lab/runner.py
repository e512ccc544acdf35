"""The credit lab's main names in one namespace: the lab audit, its report, and the runners it puts credit through.

Each lives in the module of its job: the lab envs' policies in :mod:`.policies`, the runners in
:mod:`.runners`, the audit in :mod:`.lab_audit`, its report in :mod:`.report`, the command in :mod:`.cli`.
"""

from __future__ import annotations

from twice_envs.agents.lab.lab_audit import LabAuditConfig, LabAuditResult, run_lab_audit, update_credit
from twice_envs.agents.lab.policies import LAB_ENVS, lab_policy
from twice_envs.agents.lab.report import format_lab, write_lab
from twice_envs.agents.lab.runners import lab_runners, lab_step_fns

__all__ = ["LAB_ENVS", "LabAuditConfig", "LabAuditResult", "format_lab", "lab_policy", "lab_runners", "lab_step_fns",
           "run_lab_audit", "update_credit", "write_lab"]
