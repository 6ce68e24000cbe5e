# One 4 MB echo over a 100 Mbit/s link (tools/workloads/bandwidth.plan): the
# request alone takes 4e6 * 8 / 1e8 = 0.32 s of simulated time to send.
workers 2
call 0 1 echo count=1 payload=4000000 timeout=inf mode=sync expect=ok
