"""`campaign plan`: the roofline figures per fleet (roofline), the whole campaign predicted in
simulated time through the stages (predict), and the saved plan (plan_file).
"""
