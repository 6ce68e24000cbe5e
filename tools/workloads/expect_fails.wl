# A negative control: w1 insists every call to w2 succeeds within 10 ms, but
# the plan partitions them, so tpsim must report FAIL (exit 1).
workers 3
call 1 2 add rate=100 for=1s timeout=10ms expect=ok
