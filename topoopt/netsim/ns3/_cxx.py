"""C++ source compiled in the ns-3 worker with ``cppyy.cppdef``: network builder and DAG driver.

Python callables cannot be ns-3 callbacks (docs/ns3-notes.md), so everything that reacts to
simulated events lives here: TCP connections that carry flows, receivers that count
bytes, the dependency-driven start of flows and compute tasks (a TEN step, an
iteration's task graph), and the stop of the simulator when a DAG is done.
"""

__all__ = ["SOURCE"]

SOURCE = r"""
#include "ns3/core-module.h"
#include "ns3/network-module.h"
#include "ns3/internet-module.h"
#include "ns3/point-to-point-module.h"
#include "ns3/traffic-control-module.h"
#include <deque>
#include <functional>
#include <map>
#include <queue>
#include <set>
#include <string>
#include <vector>

namespace topoopt_ns3 {
using namespace ns3;

// Strict priority for pure ACKs (and other small segments): REACT section 7.3
// "prioritize ACKs in switch queues". Band 0 = ACKs, band 1 = data.
class AckFirstFilter : public Ipv4PacketFilter {
  private:
    int32_t DoClassify(Ptr<QueueDiscItem> item) const override {
        return item->GetPacket()->GetSize() <= 60 ? 0 : 1;
    }
};

struct Conn {
    uint32_t src = 0, dst = 0;
    Ipv4Address addr;
    uint16_t port = 0;
    Ptr<Socket> tx;
    uint64_t pending = 0;   // bytes still to hand to the socket
    uint64_t target = 0;    // cumulative bytes handed to this connection by flows
    uint64_t received = 0;  // cumulative bytes the receiver read
    std::deque<std::pair<uint64_t, int64_t>> waits;  // (cumulative target, dag node)
    bool greedy = false;
};

class Driver {
  public:
    // ------------------------------------------------------------------ set-up
    void Reset(uint32_t seed, uint32_t run) {
        Simulator::Destroy();
        // A binary heap: same (time, uid) event order as the default map, cheaper inserts.
        GlobalValue::Bind("SchedulerType", TypeIdValue(HeapScheduler::GetTypeId()));
        RngSeedManager::ResetNextStreamIndex();
        RngSeedManager::SetSeed(seed);
        RngSeedManager::SetRun(run);
        m_nodes = NodeContainer();
        m_devA.clear(); m_devB.clear(); m_ifA.clear(); m_ifB.clear();
        m_rootA.clear(); m_rootB.clear();
        m_conns.clear(); m_txConn.clear(); m_rxConn.clear(); m_listen.clear();
        m_nextPort.clear(); m_listeners.clear(); m_accepted.clear();
        ClearDag();
    }

    void Configure(uint32_t mss, uint32_t sndBuf, uint32_t rcvBuf, uint32_t initCwnd,
                   double minRto, double delAck, bool dctcp, uint32_t mtu,
                   uint32_t devQueue, double redMin, double redMax, uint32_t bufferPkts,
                   bool ackPriority, double maxP) {
        Config::SetDefault("ns3::TcpL4Protocol::SocketType",
                           TypeIdValue(dctcp ? TcpDctcp::GetTypeId() : TcpNewReno::GetTypeId()));
        Config::SetDefault("ns3::TcpSocket::SegmentSize", UintegerValue(mss));
        Config::SetDefault("ns3::TcpSocket::SndBufSize", UintegerValue(sndBuf));
        Config::SetDefault("ns3::TcpSocket::RcvBufSize", UintegerValue(rcvBuf));
        Config::SetDefault("ns3::TcpSocket::InitialCwnd", UintegerValue(initCwnd));
        Config::SetDefault("ns3::TcpSocket::DelAckCount", UintegerValue(2));
        Config::SetDefault("ns3::TcpSocket::DelAckTimeout", TimeValue(Seconds(delAck)));
        Config::SetDefault("ns3::TcpSocketBase::MinRto", TimeValue(Seconds(minRto)));
        Config::SetDefault("ns3::TcpSocketBase::ClockGranularity", TimeValue(MicroSeconds(1)));
        Config::SetDefault("ns3::TcpSocketBase::UseEcn", StringValue(dctcp ? "On" : "Off"));
        m_mtu = mtu;
        m_devQueue = devQueue;
        m_redMin = redMin; m_redMax = redMax; m_bufferPkts = bufferPkts;
        m_ackPriority = ackPriority; m_maxP = maxP;
        m_greedyBacklog = std::max<uint64_t>(64 * mss, 1 << 18);
        m_sndBuf = sndBuf;
    }

    void AddNodes(uint32_t n) {
        NodeContainer c;
        c.Create(n);
        InternetStackHelper stack;
        Ipv4StaticRoutingHelper st;
        stack.SetRoutingHelper(st);
        stack.SetIpv6StackInstall(false);
        stack.Install(c);
        m_nodes.Add(c);
    }

    // A point-to-point cable: a's device sends at rateAB, b's at rateBA; queueX: the
    // kind of X's egress queue (see InstallQueue).
    int AddChannel(uint32_t a, uint32_t b, double rateAB, double rateBA, double delay,
                   uint32_t subnet, int queueA, int queueB) {
        PointToPointHelper p2p;
        p2p.SetChannelAttribute("Delay", TimeValue(Seconds(delay)));
        p2p.SetDeviceAttribute("Mtu", UintegerValue(m_mtu));
        p2p.SetQueue("ns3::DropTailQueue<Packet>", "MaxSize",
                     QueueSizeValue(QueueSize(QueueSizeUnit::PACKETS, m_devQueue)));
        NetDeviceContainer d = p2p.Install(m_nodes.Get(a), m_nodes.Get(b));
        DynamicCast<PointToPointNetDevice>(d.Get(0))->SetDataRate(DataRate(uint64_t(rateAB)));
        DynamicCast<PointToPointNetDevice>(d.Get(1))->SetDataRate(DataRate(uint64_t(rateBA)));
        m_rootA.push_back(InstallQueue(d.Get(0), queueA, rateAB));
        m_rootB.push_back(InstallQueue(d.Get(1), queueB, rateBA));
        for (int end = 0; end < 2; ++end) {
            Ptr<Ipv4> ipv4 = m_nodes.Get(end ? b : a)->GetObject<Ipv4>();
            uint32_t i = ipv4->AddInterface(d.Get(end));
            ipv4->AddAddress(i, Ipv4InterfaceAddress(Ipv4Address(subnet + 1 + end),
                                                     Ipv4Mask("255.255.255.252")));
            ipv4->SetMetric(i, 1);
            ipv4->SetUp(i);
            (end ? m_ifB : m_ifA).push_back(i);
            (end ? m_devB : m_devA).push_back(d.Get(end));
        }
        return int(m_ifA.size()) - 1;
    }

    uint32_t IfIndex(int channel, int end) const { return end ? m_ifB[channel] : m_ifA[channel]; }

    // An extra address (a path plane's) on every interface of a node.
    void AddAddress(uint32_t node, uint32_t addr, uint32_t prefix) {
        Ptr<Ipv4> ipv4 = m_nodes.Get(node)->GetObject<Ipv4>();
        Ipv4Mask mask(~uint32_t(0) << (32 - prefix));
        for (uint32_t i = 1; i < ipv4->GetNInterfaces(); ++i) {
            ipv4->AddAddress(i, Ipv4InterfaceAddress(Ipv4Address(addr), mask));
        }
    }

    void AddRoute(uint32_t node, uint32_t addr, uint32_t ifIndex) {
        Ptr<Ipv4> ipv4 = m_nodes.Get(node)->GetObject<Ipv4>();
        Ipv4StaticRoutingHelper h;
        h.GetStaticRouting(ipv4)->AddHostRouteTo(Ipv4Address(addr), ifIndex);
    }

    void SetRate(int channel, int end, double bps) {
        Ptr<NetDevice> d = end ? m_devB[channel] : m_devA[channel];
        DynamicCast<PointToPointNetDevice>(d)->SetDataRate(DataRate(uint64_t(bps)));
    }

    // ------------------------------------------------------------ connections
    int AddConn(uint32_t src, uint32_t dst, uint32_t addr) {
        Conn c;
        c.src = src; c.dst = dst; c.addr = Ipv4Address(addr);
        uint32_t port = m_nextPort.count(dst) ? m_nextPort[dst] : 1024u;
        NS_ABORT_MSG_IF(port > 65000, "too many connections into one node");
        m_nextPort[dst] = port + 1;
        c.port = uint16_t(port);
        int id = int(m_conns.size());
        m_conns.push_back(c);
        Ptr<Socket> l = Socket::CreateSocket(m_nodes.Get(dst), TcpSocketFactory::GetTypeId());
        l->Bind(InetSocketAddress(Ipv4Address::GetAny(), c.port));
        l->Listen();
        l->SetAcceptCallback(MakeNullCallback<bool, Ptr<Socket>, const Address&>(),
                             MakeCallback(&Driver::OnAccept, this));
        m_listen[(uint64_t(dst) << 16) | port] = id;
        m_listeners.push_back(l);
        return id;
    }

    void SetGreedy(int id, bool on) {
        Conn& c = m_conns[id];
        c.greedy = on;
        c.pending = on ? (uint64_t(1) << 62) : 0;
        if (on) Simulator::ScheduleNow(&Driver::StartGreedy, this, id);
    }

    uint64_t Received(int id) const { return m_conns[id].received; }
    uint64_t Sent(int id) const { return m_conns[id].target; }

    // ------------------------------------------------------------------ DAGs
    void ClearDag() {
        m_kind.clear(); m_conn.clear(); m_bytes.clear(); m_dur.clear(); m_res.clear();
        m_prio.clear(); m_pendingDeps.clear(); m_succ.clear(); m_start.clear();
        m_finish.clear(); m_done = 0; m_busy.clear(); m_queues.clear(); m_dirty.clear();
    }

    void LoadDag(const std::vector<int>& kind, const std::vector<int>& conn,
                 const std::vector<double>& bytes, const std::vector<double>& dur,
                 const std::vector<int>& res, const std::vector<double>& prio,
                 const std::vector<int>& before, const std::vector<int>& after) {
        ClearDag();
        size_t n = kind.size();
        m_kind = kind; m_conn = conn; m_bytes = bytes; m_dur = dur; m_res = res; m_prio = prio;
        m_pendingDeps.assign(n, 0);
        m_succ.assign(n, std::vector<int>());
        m_start.assign(n, -1.0);
        m_finish.assign(n, -1.0);
        for (size_t k = 0; k < before.size(); ++k) {
            m_succ[before[k]].push_back(after[k]);
            m_pendingDeps[after[k]] += 1;
        }
    }

    // Start every node without predecessors now and run until the DAG is done
    // (0) or ``limit`` seconds of simulated time have passed (1).
    int RunDag(double limit) {
        m_timedOut = false;
        m_t0 = Simulator::Now().GetSeconds();
        if (m_kind.empty()) return 0;
        // Scheduled, not called: nodes initialize (and traffic control learns its
        // devices) in events at time 0, before any socket may send.
        Simulator::ScheduleNow(&Driver::StartRoots, this);
        m_timeout = Simulator::Schedule(Seconds(limit), &Driver::OnTimeout, this);
        if (m_done < m_kind.size()) Simulator::Run();
        m_timeout.Cancel();
        return m_timedOut ? 1 : 0;
    }

    // Let background traffic run on for ``seconds`` (e.g. to reach steady state).
    void Advance(double seconds) {
        Simulator::Stop(Seconds(seconds));
        Simulator::Run();
    }

    double Now() const { return Simulator::Now().GetSeconds(); }
    const std::vector<double>& Starts() const { return m_start; }
    const std::vector<double>& Finishes() const { return m_finish; }
    size_t Done() const { return m_done; }

    // Bytes and drops of the queue disc in front of a device (what the link carried).
    uint64_t LinkBytes(int channel, int end) const {
        return (end ? m_rootB : m_rootA)[channel]->GetStats().nTotalDequeuedBytes;
    }
    uint64_t LinkDrops(int channel, int end) const {
        return (end ? m_rootB : m_rootA)[channel]->GetStats().nTotalDroppedPackets;
    }
    uint64_t LinkMarks(int channel, int end) const {
        return (end ? m_rootB : m_rootA)[channel]->GetStats().nTotalMarkedPackets;
    }

  private:
    // The queue in front of one device, by the kind of node that owns it:
    // 1 (a switch port): RED/ECN, with pure ACKs in a strict-priority band when
    //   m_ackPriority (REACT section 7.3);
    // 0 (a server's NIC): per-flow fair queueing (FQ-CoDel, whose CoDel targets are far
    //   above these time scales, so it never drops; sparse flows such as ACKs go first)
    //   that marks ECN when a flow's packets wait longer than m_redMax packet times.
    //   A host's qdisc shares its NIC among its flows, and the per-flow mark keeps a
    //   DCTCP window near the path's BDP (as TCP small queues would) instead of
    //   growing into a host queue -- whether the server sends its own flows or, on a
    //   direct-connect fabric, relays others'.
    Ptr<QueueDisc> InstallQueue(Ptr<NetDevice> dev, int kind, double rate) {
        TrafficControlHelper tch;
        QueueSizeValue cap(QueueSize(QueueSizeUnit::PACKETS, m_bufferPkts));
        if (kind == 0) {
            double ce = m_redMax * (m_mtu + 2) * 8.0 / rate;
            tch.SetRootQueueDisc("ns3::FqCoDelQueueDisc", "MaxSize", cap, "Target",
                                 StringValue("50ms"), "Interval", StringValue("1s"), "UseEcn",
                                 BooleanValue(true), "CeThreshold", TimeValue(Seconds(ce)));
            return tch.Install(dev).Get(0);
        }
        auto red = [&](uint16_t h, uint16_t cls) {
            tch.AddChildQueueDisc(h, cls, "ns3::RedQueueDisc", "MinTh", DoubleValue(m_redMin),
                                  "MaxTh", DoubleValue(m_redMax), "MaxSize", cap, "UseEcn",
                                  BooleanValue(true), "UseHardDrop", BooleanValue(false),
                                  "QW", DoubleValue(1.0), "Gentle", BooleanValue(false),
                                  "LInterm", DoubleValue(1.0 / m_maxP), "MeanPktSize",
                                  UintegerValue(m_mtu));
        };
        if (m_ackPriority) {
            uint16_t h = tch.SetRootQueueDisc("ns3::PrioQueueDisc", "Priomap",
                                              StringValue("1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1"));
            TrafficControlHelper::ClassIdList cid =
                tch.AddQueueDiscClasses(h, 2, "ns3::QueueDiscClass");
            tch.AddChildQueueDisc(h, cid[0], "ns3::FifoQueueDisc", "MaxSize", cap);
            red(h, cid[1]);
        } else {
            tch.SetRootQueueDisc("ns3::RedQueueDisc", "MinTh", DoubleValue(m_redMin), "MaxTh",
                                 DoubleValue(m_redMax), "MaxSize", cap, "UseEcn",
                                 BooleanValue(true), "UseHardDrop", BooleanValue(false), "QW",
                                 DoubleValue(1.0), "Gentle", BooleanValue(false), "LInterm",
                                 DoubleValue(1.0 / m_maxP), "MeanPktSize", UintegerValue(m_mtu));
        }
        QueueDiscContainer q = tch.Install(dev);
        if (m_ackPriority) q.Get(0)->AddPacketFilter(CreateObject<AckFirstFilter>());
        return q.Get(0);
    }

    void EnsureTx(int id) {
        Conn& c = m_conns[id];
        if (c.tx) return;
        c.tx = Socket::CreateSocket(m_nodes.Get(c.src), TcpSocketFactory::GetTypeId());
        c.tx->Bind();
        c.tx->Connect(InetSocketAddress(c.addr, c.port));
        c.tx->SetSendCallback(MakeCallback(&Driver::OnSendSpace, this));
        m_txConn[PeekPointer(c.tx)] = id;
    }

    void TrySend(int id) {
        Conn& c = m_conns[id];
        while (c.pending > 0) {
            uint32_t avail = c.tx->GetTxAvailable();
            if (c.greedy) {
                // every socket has the configured send buffer (no per-ACK attribute lookup)
                uint64_t buffered = m_sndBuf - avail;
                if (buffered >= m_greedyBacklog) break;
                avail = uint32_t(std::min<uint64_t>(avail, m_greedyBacklog - buffered));
            }
            if (avail == 0) break;
            uint32_t chunk = uint32_t(std::min<uint64_t>(c.pending, avail));
            int r = c.tx->Send(Create<Packet>(chunk));
            if (r <= 0) break;
            c.pending -= uint64_t(r);
        }
    }

    void OnSendSpace(Ptr<Socket> s, uint32_t) {
        auto it = m_txConn.find(PeekPointer(s));
        if (it != m_txConn.end()) TrySend(it->second);
    }

    void OnAccept(Ptr<Socket> s, const Address&) {
        Address local;
        s->GetSockName(local);
        uint16_t port = InetSocketAddress::ConvertFrom(local).GetPort();
        uint32_t node = s->GetNode()->GetId();
        auto it = m_listen.find((uint64_t(node) << 16) | port);
        NS_ABORT_MSG_IF(it == m_listen.end(), "accepted an unknown connection");
        m_rxConn[PeekPointer(s)] = it->second;
        m_accepted.push_back(s);
        s->SetRecvCallback(MakeCallback(&Driver::OnRecv, this));
    }

    void OnRecv(Ptr<Socket> s) {
        int id = m_rxConn[PeekPointer(s)];
        Conn& c = m_conns[id];
        Ptr<Packet> p;
        while ((p = s->Recv(std::numeric_limits<uint32_t>::max(), 0)) && p->GetSize() > 0) {
            c.received += p->GetSize();
        }
        while (!c.waits.empty() && c.waits.front().first <= c.received) {
            int64_t node = c.waits.front().second;
            c.waits.pop_front();
            Complete(int(node));
        }
    }

    void StartRoots() {
        for (size_t i = 0; i < m_kind.size(); ++i) {
            if (m_pendingDeps[i] == 0) Ready(int(i));
        }
        DispatchDirty();
    }

    // Tasks made ready together compete by priority: start them only after the batch.
    void DispatchDirty() {
        std::vector<int> dirty(m_dirty.begin(), m_dirty.end());
        m_dirty.clear();
        for (int r : dirty) Dispatch(r);
    }

    void StartGreedy(int id) { EnsureTx(id); TrySend(id); }

    void Ready(int i) {
        if (m_kind[i] == 0) {  // a flow
            m_start[i] = Simulator::Now().GetSeconds() - m_t0;
            uint64_t bytes = uint64_t(m_bytes[i] + 0.5);
            int id = m_conn[i];
            if (bytes == 0 || id < 0) {
                Simulator::ScheduleNow(&Driver::Complete, this, i);
                return;
            }
            Conn& c = m_conns[id];
            c.target += bytes;
            c.waits.emplace_back(c.target, i);
            c.pending += bytes;
            EnsureTx(id);
            TrySend(id);
        } else {               // a task: wait for its resource (if any), then a delay
            int r = m_res[i];
            if (r < 0) {
                m_start[i] = Simulator::Now().GetSeconds() - m_t0;
                Simulator::Schedule(Seconds(m_dur[i]), &Driver::TaskEnd, this, i);
            } else {
                m_queues[r].emplace(m_prio[i], i);
                m_dirty.insert(r);
            }
        }
    }

    void Dispatch(int r) {
        if (m_busy[r] || m_queues[r].empty()) return;
        int i = m_queues[r].top().second;
        m_queues[r].pop();
        m_busy[r] = true;
        m_start[i] = Simulator::Now().GetSeconds() - m_t0;
        Simulator::Schedule(Seconds(m_dur[i]), &Driver::TaskEnd, this, i);
    }

    void TaskEnd(int i) {
        int r = m_res[i];
        if (r >= 0) { m_busy[r] = false; m_dirty.insert(r); }
        Complete(i);
    }

    void Complete(int i) {
        m_finish[i] = Simulator::Now().GetSeconds() - m_t0;
        ++m_done;
        for (int j : m_succ[i]) {
            if (--m_pendingDeps[j] == 0) Ready(j);
        }
        DispatchDirty();
        if (m_done == m_kind.size()) Simulator::Stop();
    }

    void OnTimeout() { m_timedOut = true; Simulator::Stop(); }

    NodeContainer m_nodes;
    std::vector<Ptr<NetDevice>> m_devA, m_devB;
    std::vector<uint32_t> m_ifA, m_ifB;
    std::vector<Ptr<QueueDisc>> m_rootA, m_rootB;
    std::vector<Conn> m_conns;
    std::map<Socket*, int> m_txConn, m_rxConn;
    std::map<uint64_t, int> m_listen;
    std::map<uint32_t, uint32_t> m_nextPort;
    std::vector<Ptr<Socket>> m_listeners, m_accepted;
    uint32_t m_mtu = 1500, m_devQueue = 4, m_bufferPkts = 21000;
    double m_redMin = 32, m_redMax = 60, m_maxP = 1.0;
    bool m_ackPriority = true;
    uint64_t m_greedyBacklog = 1 << 17;
    uint64_t m_sndBuf = 4 << 20;

    std::vector<int> m_kind, m_conn, m_res;
    std::vector<double> m_bytes, m_dur, m_prio, m_start, m_finish;
    std::vector<int> m_pendingDeps;
    std::vector<std::vector<int>> m_succ;
    size_t m_done = 0;
    std::map<int, bool> m_busy;
    std::set<int> m_dirty;
    std::map<int, std::priority_queue<std::pair<double, int>, std::vector<std::pair<double, int>>,
                                      std::greater<std::pair<double, int>>>> m_queues;
    double m_t0 = 0;
    bool m_timedOut = false;
    EventId m_timeout;
};

}  // namespace topoopt_ns3
"""
