"""Gradual traffic (step 7 of the loop): move traffic to a candidate deployment in steps, judge each
step against what the simulator predicted for that share, roll back by itself on a breach, and stop
for a person's approval where the plan says so."""
