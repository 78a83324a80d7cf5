// What a handler process says about itself when the harness opens it.

using System;
using System.Threading;

namespace Dsm.DataStateMachine.Protocol
{
    public sealed class HostOptions
    {
        public HostOptions()
        {
            Concurrent = true;
        }

        /// <summary>Shown in the harness's logs and reports.</summary>
        public string Name { get; set; }

        /// <summary>
        /// True (the default): the process accepts requests before it has answered earlier
        /// ones, and answers may come back in any order. False: the harness sends one request
        /// at a time (races then happen only across processes on a named store). The
        /// command-line flag <c>--serial</c> sets it to false.
        /// </summary>
        public bool Concurrent { get; set; }

        /// <summary>
        /// Every process started with this command and environment reaches one store (a
        /// database its configuration names), so dsm stress can race processes on it.
        /// Said only when the harness names no store.
        /// </summary>
        public bool SharedStore { get; set; }
    }

    /// <summary>
    /// The clock a hosted handler reads: the <c>now</c> of the request being served. Carried
    /// in an <see cref="AsyncLocal{T}"/>, so requests in flight together never see each
    /// other's instant, and an await inside a handler keeps its own request's.
    /// </summary>
    internal sealed class RequestClock : IClock
    {
        private readonly AsyncLocal<DateTime?> current = new AsyncLocal<DateTime?>();
        private long latest;

        public DateTime UtcNow
        {
            get
            {
                var now = current.Value;
                return now.HasValue ? now.Value : new DateTime(Interlocked.Read(ref latest), DateTimeKind.Utc);
            }
        }

        /// <summary>The instant of the request about to be served (also what a read outside any request answers).</summary>
        public void Serve(DateTime now)
        {
            current.Value = now;
            Interlocked.Exchange(ref latest, now.Ticks);
        }
    }
}
