"""The demo: generated support tickets (tickets.py) and a campaign over them (campaign.py).

The tickets are made to carry the problems the audit exists for (conversations whose messages
repeat each other, stock replies shared across conversations) so that a naive random split
visibly fails D2 and D8 while a split by conversation passes.
"""
