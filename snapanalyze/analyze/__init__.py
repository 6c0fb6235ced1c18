"""Analyses: functions from a Snapshot/Timeline to DataFrames and documents; nothing here prints or plots."""
