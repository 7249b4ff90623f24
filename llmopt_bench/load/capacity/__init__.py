"""The capacity search: the highest rate that meets the SLO in steady state, from the ceiling, within a
budget of seconds, with its hold."""
